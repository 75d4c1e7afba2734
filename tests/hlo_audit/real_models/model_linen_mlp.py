"""flax.linen MLP classifier, trained with optax adam through a TrainState
(as flax's examples/mnist writes its train step)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

BATCH, FEATURES, HIDDEN, CLASSES = 128, 256, 512, 16


class MLP(nn.Module):
  hidden: int = HIDDEN
  classes: int = CLASSES

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(self.hidden)(x)  # <dense1>
    x = nn.relu(x)  # <relu1>
    x = nn.Dense(self.hidden)(x)  # <dense2>
    x = nn.gelu(x)  # <gelu2>
    return nn.Dense(self.classes)(x)  # <logits>


def train_step(state, batch):
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["x"])  # <apply>
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()  # <loss>
    return loss
  loss, grads = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  state = state.apply_gradients(grads=grads)  # <update>
  return state, loss


def build():
  model = MLP()
  x = jnp.zeros((BATCH, FEATURES), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.adam(1e-3))
  batch = {"x": x, "y": jnp.zeros((BATCH,), jnp.int32)}
  return jax.jit(train_step), (state, batch)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# Each dense layer is a library dot (__ynn_fusion or dot) writing f32 and loop
# fusions around it; no copy, transpose or expanded broadcast anywhere.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_ACT = f"f32[{BATCH},{HIDDEN}]"
_MN4 = 2 * BATCH * HIDDEN * 4

TRUTH = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, _ACT, "dense1", why=(
            "x @ W0 is written and read back by the bias+relu fusion (and by "
            "the relu-backward mask): bias and relu belong in the matmul's store")),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "dense2", count=2, why=(
            "forward h1 @ W1 read back by bias+gelu; backward dz2 @ W1^T read "
            "once by the relu-backward select")),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "logits", bytes=_MN4, why=(
            "backward dlogits @ W2^T read once by the gelu-backward fusion")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{FEATURES},{HIDDEN}]", "dense1", why=(
            "weight gradient x^T @ dz1 written, then read by adam's mu and nu "
            "kernels separately: one epilogue could write both moments")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{HIDDEN}]", "dense2", why=(
            "weight gradient h1^T @ dz2 read by adam's mu and nu kernels")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{CLASSES}]", "logits", why=(
            "weight gradient h2^T @ dlogits read by adam's mu and nu kernels")),
        Expect(K.SEPARATE_REDUCTION, _ACT, "relu1", bytes=_MN4 // 2, why=(
            "relu-backward dz1 re-read by the bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _ACT, "gelu2", bytes=_MN4 // 2, why=(
            "gelu-backward dz2 re-read by the bias-gradient reduce")),
        Expect((K.SEPARATE_REDUCTION, K.UNFUSED_EPILOGUE), f"f32[{BATCH},{CLASSES}]",
               "logits", why="logits re-read by the softmax's max pass, exp pass "
               "and label gather (bias add unfused too)"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss", count=2, why=(
            "exp(logits - max) re-read by the sum; dlogits (the scatter's "
            "result) re-read by the bias-gradient reduce-window")),
        # Judged with the suite's every-finding rule (read off the HLO):
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
    ),
    not_flagged=(
        NotFlagged("the scatter-add writes into its operand in place: the "
                   "destination is not an expanded broadcast",
                   kind=K.EXPANDED_BROADCAST),
        NotFlagged("no layer norm here: the only row reductions are the "
                   "softmax's and the bias gradients'", says="layer_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/linen_mlp.hlo.gz, jax
# 0.12). Every dot is a Triton gemm fusion. The forward and input-gradient
# dots are split-K: the gemm writes partial sums f32[k,128,N] and one loop
# fusion sums them with the bias and the activation (the gemm's own
# finish, no boundary); relu and its bias are recomputed as the next gemms'
# prologue. Each weight gradient is read by one adam fusion writing the
# parameter and both moments.
_SPLIT_K = ("f32[4,128,512]", "f32[8,128,512]", "f32[16,128,16]")

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{HIDDEN}]", "dense2", says="outputs:3",
               bytes=2 * HIDDEN * HIDDEN * 4, why=(
                   "weight gradient h1^T @ dz2 written, then read once by the adam "
                   "fusion that writes the parameter, mu and nu: an epilogue writing "
                   "three outputs")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{FEATURES},{HIDDEN}]", "dense1", says="outputs:3",
               why="weight gradient x^T @ dz1 read once by its adam fusion"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{CLASSES}]", "logits", says="outputs:3",
               why="weight gradient h2^T @ dlogits read once by its adam fusion"),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "logits", bytes=_MN4, why=(
            "backward dlogits @ W2^T read once by the gelu-backward fusion")),
        Expect(K.SEPARATE_REDUCTION, _ACT, "gelu2", bytes=_MN4 // 2, why=(
            "gelu-backward dz2 re-read by the bias-gradient reduce (and by two "
            "gemms)")),
        Expect(K.SEPARATE_REDUCTION, _ACT, "relu1", bytes=_MN4 // 2, why=(
            "relu-backward dz1 (the split-K sum of dz2 @ W1^T, masked) re-read by "
            "the bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss", says="log_softmax",
               why=("the logits, written with their row max by the split-K sum of the "
                    "last gemm, re-read by the exp-sum and the loss reductions")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss",
               says="column_reduction", why=(
                   "dlogits (the scatter's result, in place) re-read by the "
                   "bias-gradient reduce")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it")),
    ),
    not_flagged=tuple(
        NotFlagged("split-K partial sums belong to their gemm: the loop fusion "
                   "summing them finishes the dot", shape=s) for s in _SPLIT_K) + (
        NotFlagged("no layer norm here", says="layer_norm"),
    ),
)

"""flax.linen MLP classifier whose TrainState is donated to the jitted step
(`donate_argnums=(0,)`, as flax's examples do): XLA updates params and adam
moments in place, and copies a donated param it still reads afterwards."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

BATCH, FEATURES, HIDDEN, CLASSES = 128, 256, 512, 16


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(HIDDEN)(x))  # <dense1>
    x = nn.relu(nn.Dense(HIDDEN)(x))  # <dense2>
    return nn.Dense(CLASSES)(x)  # <logits>


@functools.partial(jax.jit, donate_argnums=(0,))  # <donate>
def train_step(state, batch):
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["x"])  # <apply>
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  return state.apply_gradients(grads=grads), loss  # <update>


def build():
  model = MLP()
  x = jnp.zeros((BATCH, FEATURES), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.adam(1e-3))
  return train_step, (state, {"x": x, "y": jnp.zeros((BATCH,), jnp.int32)})


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same). The
# TrainState aliases every input to its output; XLA copies three donated
# params at entry (`copy(state_params...)`, no metadata) because the backward
# dots read them after the in-place adam update would overwrite them.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_ACT = f"f32[{BATCH},{HIDDEN}]"
_MN4 = 2 * BATCH * HIDDEN * 4

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, f"f32[{HIDDEN},{HIDDEN}]", None, says="donat", why=(
            "copy.5: donated Dense_1 kernel copied because ynn_fusion.2 (dz2 @ "
            "W1^T) reads it after its aliased output is written")),
        Expect(K.STANDALONE_COPY, f"f32[{HIDDEN},{CLASSES}]", None, says="donat", why=(
            "copy.7: donated Dense_2 kernel, read by the backward dot after the "
            "update")),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "dense1", why="x @ W0 read back by bias+relu "
               "(and the relu-backward mask)"),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "dense2", count=2, why=(
            "h1 @ W1 read back by bias+relu; dz2 @ W1^T read once by the "
            "relu-backward select")),
        Expect(K.UNFUSED_EPILOGUE, _ACT, "logits", bytes=_MN4, why=(
            "dlogits @ W2^T read once by the relu-backward select")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{FEATURES},{HIDDEN}]", "dense1",
               why="weight gradient read by adam's mu and nu kernels"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{HIDDEN}]", "dense2",
               why="weight gradient read by adam's mu and nu kernels"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{CLASSES}]", "logits",
               why="weight gradient read by adam's mu and nu kernels"),
        Expect(K.SEPARATE_REDUCTION, _ACT, "dense1", bytes=_MN4 // 2,
               why="relu-backward dz1 re-read by the bias-gradient reduce"),
        Expect(K.SEPARATE_REDUCTION, _ACT, "dense2", bytes=_MN4 // 2,
               why="relu-backward dz2 re-read by the bias-gradient reduce"),
        Expect((K.SEPARATE_REDUCTION, K.UNFUSED_EPILOGUE), f"f32[{BATCH},{CLASSES}]",
               "logits", why="logits re-read by the softmax passes"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss", count=2,
               why="exp(logits - max) re-read by the sum; dlogits by the bias "
               "gradient"),
    ),
    not_flagged=(
        NotFlagged("a donation copy is not a layout change: same layout {1,0} "
                   "in and out", says="layout change"),
        NotFlagged("a donation copy is not a layout conflict", kind=K.LAYOUT_CONFLICT),
        NotFlagged("the scatter-add's destination is written in place",
                   kind=K.EXPANDED_BROADCAST),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/donated.hlo.gz, jax
# 0.12): linen_mlp's structure (split-K gemms whose sums fuse bias and
# relu, one adam fusion per parameter) with the state donated, so every
# output but two biases reuses its argument's buffer in place.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, f"f32[{HIDDEN}]", "dense1", says="aliasing copy", why=(
            "Dense_0's bias is donated but read by the relu masks and gemm "
            "prologues after its adam update: XLA copies it first")),
        Expect(K.STANDALONE_COPY, f"f32[{HIDDEN}]", "dense2", says="aliasing copy",
               why="Dense_1's bias, likewise"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{HIDDEN}]", "dense2", says="outputs:3",
               why="dW1 read once by its adam fusion (parameter, mu, nu)"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{FEATURES},{HIDDEN}]", "dense1", says="outputs:3",
               why="dW0 read once by its adam fusion"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{CLASSES}]", "logits", says="outputs:3",
               why="dW2 read once by its adam fusion"),
        Expect(K.SEPARATE_REDUCTION, _ACT, "logits", says="column_reduction", bytes=_MN4,
               why=("dlogits @ W2^T read once by the kernel applying the relu mask "
                    "and summing the bias gradient: the gemm's epilogue could "
                    "(cuBLASLt's DRELU_BGRAD does)")),
        Expect(K.SEPARATE_REDUCTION, _ACT, "dense1", says="column_reduction", why=(
            "relu-backward dz1 re-read by the bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss", says="log_softmax",
               why="the logits re-read by the exp-sum and the loss reductions"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{CLASSES}]", "loss",
               says="column_reduction", why="dlogits re-read by the bias-gradient reduce"),
    ),
    not_flagged=(
        NotFlagged("the state is donated", kind=K.UNDONATED_ARGUMENT),
        NotFlagged("split-K partial sums belong to their gemm", shape="f32[8,128,512]"),
        NotFlagged("split-K partial sums belong to their gemm", shape="f32[16,128,16]"),
    ),
)

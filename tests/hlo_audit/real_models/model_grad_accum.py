"""flax.linen MLP trained with gradient accumulation: the batch is split
into microbatches, `jax.lax.scan` sums their gradients, and optax adam
applies the mean once (the pattern of accumulating before one update)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

MICRO, BATCH, DIM, HIDDEN, OUT = 4, 32, 128, 256, 16


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(HIDDEN)(x))  # <dense1>
    return nn.Dense(OUT)(h)  # <dense2>


model = MLP()
tx = optax.adam(1e-3)


def train_step(params, opt_state, xs, ys):
  def loss_fn(params, x, y):
    pred = model.apply({"params": params}, x)  # <apply>
    return jnp.mean((pred - y) ** 2)  # <loss>

  def accumulate(acc, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)  # <grad>
    return jax.tree.map(jnp.add, acc, grads), loss  # <acc>

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, losses = jax.lax.scan(accumulate, zeros, (xs, ys))  # <scan>
  grads = jax.tree.map(lambda g: g / MICRO, grads)  # <mean>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, losses.mean()


def build():
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params),
                               jnp.zeros((MICRO, BATCH, DIM)),
                               jnp.zeros((MICRO, BATCH, OUT)))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# The scan's body runs one microbatch's forward and backward pass (4 trips):
# the microbatch is dynamic-sliced out of the stacked batch for the dots; the
# bias gradients are reduces of the backward terms; each weight gradient dot
# is read back by the accumulation add (a residual epilogue); adam updates
# once after the loop.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

TRUTH = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, "f32[128,256]", "dense1", why=(
            "residual: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[32,256]", "dense2", why=(
            "mask: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,16]", "dense2", why=(
            "residual: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[32,256]", "dense1", why=(
            "outputs:1: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_PROLOGUE, "f32[32,128]", "scan", why=(
            "dynamic-slice: elementwise work written to memory only for the matmuls that read it")),
        Expect(K.SEPARATE_REDUCTION, "f32[32,256]", "dense1", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[32,16]", "dense2", says="sum_of_squares", why=(
            "the last Dense's output re-read by the loss kernel, which squares pred - y and "
            "sums every element (a squared-error total, not a bias gradient)")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "params['Dense_0']['bias']: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "opt_state[0].count: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
    ),
    not_flagged=(
        NotFlagged("the accumulation add is elementwise, not a norm", says="norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/grad_accum.hlo.gz, jax
# 0.12). One while loop (4 microbatches): x and y sliced by async fusions,
# the forward gemm split-K (its sum fused with bias and relu), pred - y in
# the second gemm's epilogue, the gradient accumulation fused into the
# weight-gradient gemms' epilogues; adam runs once after the loop.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_PROLOGUE, f"f32[1,{BATCH},{DIM}]", "scan", says="dynamic-slice", why=(
            "the microbatch x sliced into its own buffer for the forward gemm and "
            "the dW1 gemm, each trip")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[1,{BATCH},{OUT}]", "scan", says="dynamic-slice",
               why="the microbatch y sliced for the gemm computing pred - y"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{HIDDEN}]", "dense2",
               says="column_reduction", why=(
                   "dpred @ W2^T read once by the kernel applying the relu mask "
                   "and summing the bias gradient")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{OUT}]", "dense2", why=(
            "pred - y re-read by the squared-error sum and the bias-gradient "
            "accumulate")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the optimizer state is returned updated but not donated")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "params are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the accumulation is fused into the weight-gradient gemms",
                   kind=K.UNFUSED_EPILOGUE),
        NotFlagged("split-K partial sums belong to their gemm", shape=f"f32[4,{BATCH},{HIDDEN}]"),
    ),
)

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
        Expect(K.SEPARATE_REDUCTION, "f32[32,16]", "dense2", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "params['Dense_0']['bias']: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "opt_state[0].count: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
    ),
    not_flagged=(
        NotFlagged("the accumulation add is elementwise, not a norm", says="norm"),
    ),
)

"""flax.linen CNN with GroupNorm (statistics per sample and group of
channels), trained with optax sgd the way flax's examples write a step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, HW, CH, GROUPS, CLASSES = 8, 32, 32, 8, 10


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Conv(CH, (3, 3))(x)  # <conv1>
    x = nn.GroupNorm(num_groups=GROUPS)(x)  # <gn1>
    x = nn.swish(x)  # <act1>
    x = nn.Conv(CH, (3, 3))(x)  # <conv2>
    x = nn.GroupNorm(num_groups=GROUPS)(x)  # <gn2>
    x = nn.swish(x)  # <act2>
    x = x.mean(axis=(1, 2))  # <gap>
    return nn.Dense(CLASSES)(x)  # <head>


model = CNN()
tx = optax.sgd(1e-2, momentum=0.9)


def train_step(params, opt_state, x, y):
  def loss_fn(params):
    logits = model.apply({"params": params}, x)  # <apply>
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss


def build():
  x = jnp.zeros((BATCH, HW, HW, 3), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params), x,
                               jnp.zeros((BATCH,), jnp.int32))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# flax's GroupNorm reshapes conv output [8,32,32,32] to [8,32,32,8,4] and
# reduces dims {1,2,4} (mean and mean of squares): per-sample statistics, the
# batch axis kept, one per group. x - mean is written in the forward pass
# only for the backward reduce that multiplies it by dy (recomputable from x
# and the mean). Convolutions are ynn library calls whose operand transposes
# XLA:CPU inserts on purpose (kept).
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

TRUTH = ModelTruth(
    expect=(
        Expect(K.LAYOUT_CONFLICT, "f32[32,32,8,32]", "gn2", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[32,32,32,8]", "act1", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[32,32,8,32]", "gn1", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[3,32,32,8]", None, why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,32,32,32]", "conv2", why=(
            "elementwise: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,32,32,32]", "conv2", why=(
            "outputs:1: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,32,32,32]", "conv1", why=(
            "outputs:1: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[32,3,3,32]", "optax", why=(
            "transpose: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[3,3,3,32]", "optax", why=(
            "transpose: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,8,4]", "conv2", says="group_norm_stats", why=(
            "group_norm_stats: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,8,4]", "conv1", says="group_norm_stats", why=(
            "group_norm_stats: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn2", count=2, why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn1", why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn2", says="norm_backward", why=(
            "norm_backward: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn1", says="norm_backward", why=(
            "norm_backward: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "act1", why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "act2", count=2, why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn1", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,32,32]", "gn2", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "params['Conv_0']['bias']: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "opt_state[0].trace['Conv_0']['bias']: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
    ),
    not_flagged=(
        NotFlagged("GroupNorm keeps the batch axis: not batch-norm statistics",
                   says="batch_norm_stats"),
        NotFlagged("group statistics are no last-axis norm", says="pallas_kernels.layer_norm"),
        NotFlagged("XLA:CPU transposes convolution operands on purpose: not safe to drop",
                   kind=K.LAYOUT_CONFLICT, verdict="safe"),
    ),
)

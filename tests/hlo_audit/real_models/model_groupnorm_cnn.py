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

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/groupnorm_cnn.hlo.gz, jax
# 0.12). The convolutions are cuDNN's (bias fused in the forward call, the
# filters transposed to OHWI for it on purpose). GroupNorm's statistics run
# in two kernels: per-channel sums over H and W of the convolution's result,
# then the sum over each group's channels; the backward column reductions
# (bias and scale gradients) are XLA's two-stage reductions, f32[64,32]
# partial sums summed by a second kernel: one reduction, no boundary.
_GA = f"f32[{BATCH},{HW},{HW},{CH}]"

# Reductions XLA splits over two kernels are named by both stages' axes: the
# group statistics' first kernel sums H and W ({1} of [8,1024,8,4]), the next
# the group's 4 channels ({1,3} in all, 4096 elements per sample and group);
# the channel sums of the backward's dy and dx sum [64,128,32] over {1}, then
# the batch and rows ({0,1,2} of [8,32,32,32] in all).
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, _GA, "conv1", says="dims {1,3} of [8,1024,8,4]", why=(
            "conv1's result re-read by GroupNorm's sums and sums of squares over "
            "H, W and each group's channels (the batch axis kept)")),
        Expect(K.SEPARATE_REDUCTION, _GA, "conv2", says="dims {1,3} of [8,1024,8,4]",
               why="conv2's result re-read by gn2's group sums"),
        Expect(K.SEPARATE_REDUCTION, _GA, "act2", says="dims {1} of [8,1024,32]", why=(
            "gn2's apply and swish written only for global average pooling's reduce")),
        Expect(K.SEPARATE_REDUCTION, _GA, "act1", says="dims {0,1,2} of [8,32,32,32]", why=(
            "swish1-backward dy written only for gn1's backward kernel, which "
            "reduces it")),
        Expect(K.SEPARATE_REDUCTION, _GA, "act2", says="dims {0,1,2} of [8,32,32,32]", why=(
            "swish2-backward dy written only for gn2's backward kernel")),
        Expect(K.SEPARATE_REDUCTION, _GA, "gn1", says="dims {1} of [8,1024,32]", count=2, why=(
            "gn1 backward terms, one written only for its per-channel sum, one "
            "re-read by its sum beside the kernel computing dx")),
        Expect(K.SEPARATE_REDUCTION, _GA, "gn2", says="dims {1} of [8,1024,32]", count=2,
               why="the same two backward terms of gn2"),
        Expect(K.SEPARATE_REDUCTION, _GA, "gn1", says="dims {0,1,2} of [8,32,32,32]", why=(
            "gn1's dx re-read by conv1's bias-gradient reduce (in two kernels)")),
        Expect(K.SEPARATE_REDUCTION, _GA, "gn2", says="dims {0,1,2} of [8,32,32,32]", why=(
            "gn2's dx re-read by conv2's bias-gradient reduce")),
        Expect(K.UNFUSED_PROLOGUE, _GA, "act1", says="activation:silu", why=(
            "gn1's apply and swish written only for conv2 and its backward-filter "
            "convolution: a prologue of the convolution")),
        Expect(K.UNFUSED_EPILOGUE, _GA, "conv2", bytes=2 * BATCH * HW * HW * CH * 4, why=(
            "conv2's backward-input convolution read once by swish1's backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{CH},3,3,{CH}]", "conv2", says="outputs:2", why=(
            "conv2's weight gradient (OHWI) read once by the momentum fusion that "
            "transposes it back and writes the parameter and the trace")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{CH},3,3,3]", "conv1", says="outputs:2",
               why="conv1's weight gradient, likewise"),
        Expect(K.LAYOUT_CONFLICT, f"f32[{CH},3,3,{CH}]", "conv2", says="transpose", why=(
            "conv2's filter transposed HWIO -> OHWI for cuDNN on purpose (kept)")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{CH},3,3,3]", "conv1", says="transpose",
               why="conv1's filter, likewise"),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "params and the optimizer state are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("XLA's two-stage column reduction: partial sums another kernel "
                   "finishes are one reduction", shape="f32[64,32]"),
        NotFlagged("GroupNorm keeps the batch axis: not batch-norm statistics",
                   says="batch_norm_stats"),
        NotFlagged("group statistics are no last-axis norm", says="pallas_kernels.layer_norm"),
        NotFlagged("cuDNN takes the filter in OHWI: not safe to drop",
                   kind=K.LAYOUT_CONFLICT, verdict="safe"),
        NotFlagged("cuDNN's fused convolution applies the bias itself",
                   kind=K.UNFUSED_EPILOGUE, evidence="convbiasactivationforward"),
    ),
)

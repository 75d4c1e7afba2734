"""keras 3 MobileNetV3Small (JAX backend) trained as keras' guide "Writing a
training loop from scratch in JAX" writes it: `model.stateless_call` on the
trainable and non-trainable variables (BatchNorm's moving statistics,
Dropout's seed), `jax.value_and_grad(..., has_aux=True)`, the Adam
optimizer's `stateless_apply`, jitted. Small images (64x64), 10 classes,
batch 8, random weights: depthwise and pointwise convolutions, BatchNorm in
training mode, hard-swish, squeeze-and-excite, dropout."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

BATCH, SIZE, CLASSES = 8, 64, 10


def make():
  """The model, its loss and its optimizer, built as the guide builds them."""
  model = keras.applications.MobileNetV3Small(
      input_shape=(SIZE, SIZE, 3), weights=None, classes=CLASSES,
      include_preprocessing=False, classifier_activation=None)
  loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
  optimizer = keras.optimizers.Adam(learning_rate=1e-3)
  optimizer.build(model.trainable_variables)
  return model, loss_fn, optimizer


def train_step_of(model, loss_fn, optimizer):
  def compute_loss_and_updates(trainable_variables, non_trainable_variables, x, y):
    y_pred, non_trainable_variables = model.stateless_call(  # <call>
        trainable_variables, non_trainable_variables, x, training=True)
    loss = loss_fn(y, y_pred)  # <loss>
    return loss, non_trainable_variables

  grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)

  def train_step(state, data):
    trainable_variables, non_trainable_variables, optimizer_variables = state
    x, y = data
    (loss, non_trainable_variables), grads = grad_fn(  # <grad>
        trainable_variables, non_trainable_variables, x, y)
    trainable_variables, optimizer_variables = optimizer.stateless_apply(  # <apply>
        optimizer_variables, grads, trainable_variables)
    return loss, (trainable_variables, non_trainable_variables, optimizer_variables)

  return train_step


def build():
  keras.utils.set_random_seed(0)
  model, loss_fn, optimizer = make()
  state = ([v.value for v in model.trainable_variables],
           [v.value for v in model.non_trainable_variables],
           [v.value for v in optimizer.variables])
  x = jax.random.normal(jax.random.key(0), (BATCH, SIZE, SIZE, 3))
  y = jax.nn.one_hot(jnp.arange(BATCH) % CLASSES, CLASSES)
  return jax.jit(train_step_of(model, loss_fn, optimizer)), (state, (x, y))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2 and 0.12.0.1: the same kernels
# but for one broadcast, named where it differs). keras' layers live in
# site-packages, so every finding cites the user's `stateless_call` line
# (the optimizer's kernels `stateless_apply`'s); the layer is in the name
# stack. Per block: the 1x1 expand and project convolutions are XLA:CPU
# library (YNNPACK) convolutions, the depthwise ones XLA convolutions; each
# BatchNorm (training mode, no conv bias) is a mean reduce of the
# convolution's result, x - mean written for the variance's reduce, and the
# apply fused into the activation (relu, or hard-swish x * relu6(x + 3) / 6);
# squeeze-and-excite pools (a reduce over H, W), runs two 1x1 convolutions
# on [8, 1, 1, C] (bias, relu, hard-sigmoid) and scales the activation.
# Backward: each 1x1 convolution's input gradient reads its weight
# transposed ([1, 1, I, O] -> [1, 1, O, I], a kernel each) and its weight
# gradient reads the activation transposed to [C, H, W, 8]; adam (keras':
# m += (g - m) * 0.1, v += (g^2 - v) * 0.001) reads each weight gradient
# from two kernels. Each depthwise filter gradient is computed DENSE: a
# convolution writing all C x C channel pairs ([C, k, k, C], 66 MB for the
# 576-channel 5x5 layers, where the gradient is [k, k, C, 1]), a kernel
# masking it to the diagonal (iota == iota, select) and transposing it, and a
# reduce-window summing the masked buffer over one channel axis.
# Dropout's random bits come from a threefry while loop (5 trips).
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (Expect, ModelTruth,  # noqa: E402
                                               NotFlagged, per_version)

_POOLED = f"f32[{BATCH},2,2,576]"  # the last stage's activations (64 / 32 = 2)

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, f"u32[{BATCH},1,1,1024]", "call", says="loop-carry copy",
               count=2, why=(
                   "copy.377, copy.378: dropout's threefry loop (while.24) copies both "
                   "carried halves at the top of its body: each of the two kernels "
                   "writing the new halves reads both old ones")),
        Expect(K.STANDALONE_COPY, f"f32[{BATCH},1,1,576]", "call", says="same-layout copy",
               count=3, why=(
                   "bitcast_copy_fusion.11-.13: the pooled [8, 576] (global pooling, "
                   "and the squeeze-excite pools of blocks 9 and 10) copied into "
                   "[8, 1, 1, 576], the same bytes, for the next 1x1 convolution")),
        Expect(K.EXPANDED_BROADCAST, f"f32[{BATCH},576]", "call", count=2, why=(
            "wrapped_broadcast(.2): a scalar (1 / (H * W), 1/6) materialized as "
            "[8, 576] for the pooling reduces that multiply by it")),
        Expect(K.EXPANDED_BROADCAST, _POOLED, "call", count=per_version(1, 1, 0), why=(
            "jax 0.10: hard-sigmoid's 1/6 broadcast to [8, 2, 2, 576] for the global "
            "pooling reduce (0.12 folds it into the hard-sigmoid's kernel)")),
        Expect(K.LAYOUT_CONFLICT, f"f32[1024,1,1,{BATCH}]", "call",
               says="pallas_kernels.matmul", why=(
                   "transpose_copy_fusion: the dropout output [8, 1024] transposed "
                   "only for the logits' weight-gradient dot (dot.8), which could "
                   "contract dim 0 of the original")),
        Expect(K.LAYOUT_CONFLICT, f"f32[3,{SIZE},{SIZE},{BATCH}]", None, says="transpose",
               why=("transpose_copy_fusion.129: the input images transposed to "
                    "[C, H, W, N] for the stem's weight-gradient convolution "
                    "(the argument carries no stack)")),
        Expect(K.LAYOUT_CONFLICT, None, "call", says="transpose", count=54, why=(
            "transposes XLA:CPU inserts for its convolutions (kept): 39 1x1 "
            "weights [1, 1, I, O] -> [1, 1, O, I] for the input-gradient "
            "convolutions, 15 activations [8, H, W, C] -> [C, H, W, 8] for the "
            "weight-gradient ones (the depthwise layers' dense gradients, the 5x5 "
            "forward activations)")),
        Expect(K.UNFUSED_EPILOGUE, None, "apply", says="outputs:2", count=40, why=(
            "each weight gradient (38 convolutions, the logits' dot, the stem's "
            "convolution whose readers also transpose it back to HWIO) read by "
            "adam's m and v kernels: an epilogue writing both moments")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},1,1,1024]", "call", says="outputs:1", why=(
            "ynn_fusion.198: conv_2's result read by the kernel adding its bias, "
            "hard-swish and dropout's mask (the hard-swish backward reads it too, "
            "with the gradient)")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="mask transpose", count=11, why=(
            "each depthwise layer's dense filter gradient [C, k, k, C] (all channel "
            "pairs) read once by the kernel masking it to the diagonal and "
            "transposing it to [k, k, C, C]")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="slice mask", count=4, why=(
            "the stride-2 depthwise layers' input gradients, written padded "
            "([8, 33, 33, 16], ...), read once by the activation's backward, which "
            "takes their interior")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="outputs:2", count=5, why=(
            "the squeeze-excite's first 1x1 convolution ([8, 1, 1, C / 4]) read by "
            "its bias + relu kernel and by the same work transposed for the "
            "second convolution's weight gradient")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="residual", count=5, why=(
            "the expand convolutions' input gradients read once by the add of the "
            "residual branch's gradient")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="mask", count=15, why=(
            "input gradients read once by the activation's backward: the "
            "depthwise ones (hard-swish or relu backward), the project ones of "
            "blocks 1 and 2 (relu), the squeeze-excite's (relu) and the logits' "
            "(hard-swish with dropout's mask)")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine activation:relu", count=9, why=(
            "BatchNorm's apply + relu of blocks 0-2 (and the squeeze-excite "
            "scaled activation of block 0) written only for the next convolution "
            "or, transposed, for a weight-gradient convolution")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine pad", why=(
            "transpose_copy_fusion.77: block 1's expand activation recomputed, "
            "padded and transposed only for the depthwise weight-gradient "
            "convolution")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="pad", count=3, why=(
            "activations padded and transposed only for a stride-2 depthwise "
            "layer's weight-gradient convolution")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="scale", count=12, why=(
            "the squeeze-excite pools' sum * 1 / (H * W) written only for the "
            "first 1x1 convolution, and again transposed for its weight gradient")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine", count=93, why=(
            "per-channel affine work written only for convolutions: BatchNorm's "
            "backward dx (for the input-gradient convolution, and recomputed "
            "transposed for the weight-gradient one), BatchNorm's apply of the "
            "project layers (the next block's input), the squeeze-excite scaled "
            "activations")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="batch_norm_stats", count=31, why=(
            "x - mean written only for BatchNorm's variance reduce over N, H, W (the "
            "project BatchNorms of blocks 8-10 reduce it in one kernel)")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="in the forward pass", count=34, why=(
            "each convolution's result re-read by BatchNorm's mean reduce over N, "
            "H, W")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="column_reduction", count=74, why=(
            "backward terms re-read by a sum over N, H, W: BatchNorm's variance "
            "backward term (written only for its reduce), the activations' "
            "backward dy re-read by BatchNorm's dbeta and dgamma, input gradients "
            "and residual sums re-read by the previous BatchNorm's, and the "
            "squeeze-excite and conv_2 bias gradients")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="batch axis 0 kept", count=9, why=(
            "the activation (hard-swish, block 0's relu) re-read by the "
            "squeeze-excite's average pool over H, W")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="contraction", count=9, why=(
            "the squeeze-excite gate's gradient: the project input gradient (dy) "
            "times the activation, summed over H, W")),
        Expect(K.SEPARATE_REDUCTION, _POOLED, None, says="batch axis 0 kept", count=2, why=(
            "WRONG NAME: conv_1's BatchNorm apply and its hard-sigmoid "
            "relu6(x + 3) (/ 6), each written only for global average pooling, "
            "which multiplies them (hard-swish) and averages over H, W: reported "
            "as an einsum contraction")),
        Expect(K.SEPARATE_REDUCTION, None, None, says="reduce-window", count=11, why=(
            "MISSED: each depthwise layer's masked dense gradient [k, k, C, C] "
            "(broadcast_select_fusion.*, copy_select_fusion, 66 MB for the "
            "576-channel layers) written only for the reduce-window summing it "
            "over one channel axis (ynn_fusion.13, ...): the diagonal could be "
            "reduced where it is masked; the dense convolution before it computes "
            "C times the gradient's work")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "the state (trainable, non-trainable, optimizer variables) is returned "
            "updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("global average pooling of hard-swish (BatchNorm's apply times "
                   "relu6(x + 3) / 6, both computed from conv_1's result) is no einsum "
                   "contraction: the product is the activation", kind=K.SEPARATE_REDUCTION,
                   shape=_POOLED, says="contraction", evidence="written by loop fusion"),
        NotFlagged("XLA:CPU transposes its convolutions' operands on purpose: not safe "
                   "to drop", kind=K.LAYOUT_CONFLICT, verdict="safe", evidence="(convolution)"),
        NotFlagged("a transpose feeding a convolution is no matmul prologue",
                   kind=K.LAYOUT_CONFLICT, says="pallas_kernels.matmul",
                   evidence="(convolution)"),
        NotFlagged("BatchNorm statistics reduce over batch and space: no layer_norm "
                   "kernel computes that", says="layer_norm"),
        NotFlagged("no RMS norm in a BatchNorm net", says="rms_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/keras_mobilenet.hlo.gz,
# jax 0.12). Every convolution is a cuDNN call (forward, backward-filter, or
# a forward convolution with bias / result scale / side input): the filters
# transposed HWIO -> OHWI for cuDNN; depthwise filter gradients are grouped
# convolutions (no dense gradient as on XLA:CPU). BatchNorm's statistics are
# a mean kernel and a variance kernel reading the convolution's result (the
# stem's, [8, 32, 32, 16], in two stages: [64, 128, 16] -> [64, 16] -> [16]);
# adam is one kernel per weight (parameter, m and v). Many kernels write
# two outputs: an activation and its transpose, a gradient and a reduce.
# Dropout's random bits are computed inside the kernels that read them.

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.LAYOUT_CONFLICT, None, "call", says="transpose", count=71, why=(
            "transposes cuDNN requires (kept): 47 filters HWIO -> OHWI, 24 "
            "activations [8, H, W, C] -> [C, H, W, 8] for backward-filter "
            "convolutions")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="outputs:3", count=49, why=(
            "each weight gradient read once by its adam kernel, which writes the "
            "parameter and both moments (and transposes OHWI back to HWIO)")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="slice mask", count=4, why=(
            "the stride-2 depthwise layers' input gradients, written padded, "
            "read once by the activation's backward, which takes their interior")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},1,1,1024]", "call", says="outputs:2",
               count=2, why=(
                   "cudnn-conv-bias-activation.124: conv_2 (bias in the call) read by "
                   "the kernel applying hard-swish and dropout in two layouts; "
                   "cudnn-conv.212: the logits' input gradient read by the "
                   "hard-swish backward writing two layouts")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},1,1,144]", "call", says="outputs:1", count=2,
               why=("the squeeze-excite's first convolution (bias in cuDNN's call) "
                    "read by its relu kernel (the relu backward reads it too)")),
        Expect(K.UNFUSED_EPILOGUE, None, "call", says="mask", count=14, why=(
            "input gradients read once by the activation's backward: 7 depthwise, "
            "the project ones of blocks 1 and 2, 5 squeeze-excite ones")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine activation:relu pad", why=(
            "loop_pad_fusion: block 1's BatchNorm + relu written zero-padded only "
            "for the stride-2 depthwise convolution and its backward filter")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine activation:relu", count=3, why=(
            "BatchNorm + relu written only for the next convolution and its "
            "backward filter")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine activation:hard_swish pad",
               count=3, why=(
            "BatchNorm + hard-swish written zero-padded only for a stride-2 "
            "depthwise convolution and its backward filter")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="pad", count=5, why=(
            "the images, and BatchNorm's backward dx, zero-padded only for the "
            "stem's, or a stride-2 depthwise layer's input-gradient, convolution")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="scale", count=7, why=(
            "the squeeze-excite scaled activation written only for the project "
            "convolution and its backward filter")),
        Expect(K.UNFUSED_PROLOGUE, None, "call", says="affine", count=31, why=(
            "BatchNorm's backward dx (for the input-gradient and backward-filter "
            "convolutions), the project BatchNorm + residual add (the next block's "
            "input) written only for convolutions")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="batch_norm_stats", count=43, why=(
            "convolution results re-read by BatchNorm's mean and variance kernels, "
            "x - mean written for the variance's reduce, and the means (f32[576]) "
            "written by one reduce and re-read by the variance's")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},32,32,16]", "call", says="batch_norm_stats",
               why=("WRONG STATISTICS: cudnn-conv.178, the stem's result, re-read by "
                    "BatchNorm's mean over N, H, W in two stages (input_reduce_fusion.2 "
                    "[64, 128, 16] -> [64, 16], .128 -> [16]): reported as the first "
                    "stage's dims {1} of [64, 128, 16], the batch kept")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},32,32,16]", "call",
               says="bias, gamma or weight gradient", why=(
                   "WRONG STATISTICS: loop_add_fusion.2, the stem's hard-swish "
                   "backward, re-read by BatchNorm's dbeta and dgamma in two stages: "
                   "reported as the first stage's einsum contraction of [64, 128, 16]")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},1,1,576]", "call",
               says="bias, gamma or weight gradient", count=2, why=(
                   "WRONG DIRECTION: loop_select_transpose_fusion{1}, .1{1}, the "
                   "squeeze-excite gate's relu6 backward (re_lu_12, re_lu_13) re-read "
                   "by the adam kernel summing its bias gradient over the batch: "
                   "reported as a forward pooled mean of the fusion's first output's "
                   "layer (squeeze_excite_avg_pool)")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="bias, gamma or weight gradient",
               count=68, why=(
                   "backward terms re-read by a sum over N, H, W (BatchNorm's dbeta, "
                   "dgamma, the variance's backward term) or over the batch (the "
                   "squeeze-excite and conv_2 bias gradients)")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="contraction", count=9, why=(
            "the squeeze-excite gate's gradient: the project input gradient times "
            "the activation summed over H, W")),
        Expect(K.SEPARATE_REDUCTION, None, "call", says="batch axis 0 kept", count=7, why=(
            "the activation re-read by the squeeze-excite's pool over H, W")),
        Expect(K.EXPANDED_BROADCAST, None, "call", count=6, why=(
            "hard-sigmoid's + 3 broadcast to [8, 1, 1, C] as cuDNN's side input of "
            "the squeeze-excite's second convolution: it belongs in the bias the "
            "call already reads")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "the state is returned updated but not donated")),
        *(Expect((K.UNFUSED_PROLOGUE, K.LAYOUT_CONFLICT), f"f32[{BATCH},{hw},{hw},{c}]", None,
                 count=n, why=(
                     "input_multiply_transpose_fusion{1} (.1-.5): BatchNorm + "
                     "hard-swish written only for the stride-1 5x5 depthwise "
                     "convolution (a second output of the kernel writing it "
                     "transposed)"))
          for hw, c, n in ((4, 240, 2), (4, 120, 1), (4, 144, 1), (2, 576, 2))),
        *(Expect((K.UNFUSED_PROLOGUE, K.LAYOUT_CONFLICT), f"f32[1,{hw},{hw},{c},{BATCH}]", None,
                 count=n, why=(
                     "input_multiply_transpose_fusion{0} (.1-.5): the same "
                     "activation transposed only for the depthwise backward-filter "
                     "convolution"))
          for hw, c, n in ((4, 240, 2), (4, 120, 1), (4, 144, 1), (2, 576, 2))),
        # Not expected: dropout's outputs (input_select_transpose_fusion{0},
        # {1}, read only by the logits' convolution and its backward filter):
        # its random bits (threefry) would be hashed again at every reuse of
        # a tile the convolution loads. And hard-swish's backward
        # transposed for conv_2's backward filter (input_add_transpose_fusion
        # {0}) saves nothing fused: the kernel still runs for its other
        # output, and the filter would read both its inputs (64 KiB) for a
        # 32 KiB buffer.
    ),
    not_flagged=(
        NotFlagged("a two-stage reduce's first stage is not the statistic: the second "
                   "stage reduces the batch too (dims {0,1,2} of [8, 32, 32, 16])",
                   kind=K.SEPARATE_REDUCTION, shape=f"f32[{BATCH},32,32,16]",
                   evidence="of [64,128,16]"),
        NotFlagged("the squeeze-excite gate's relu6 backward (a second output of the "
                   "kernel pooling the activation) is backward work: its reduce is a "
                   "bias gradient, no forward pooled mean", kind=K.SEPARATE_REDUCTION,
                   evidence="in the forward pass"),
        NotFlagged("loop_broadcast_fusion: cuDNN's bias operand is a [C] vector the call "
                   "reads whole (zeros for a convolution called for its result scale): "
                   "there is no compact value for it to read", kind=K.EXPANDED_BROADCAST,
                   shape="f32[576]"),
        NotFlagged("cuDNN takes filters in OHWI: not safe to drop",
                   kind=K.LAYOUT_CONFLICT, verdict="safe"),
        NotFlagged("cuDNN's fused convolution applies the bias itself",
                   kind=K.UNFUSED_EPILOGUE, evidence="bias;"),
        NotFlagged("BatchNorm statistics reduce over batch and space: no layer_norm "
                   "kernel computes that", says="layer_norm"),
        NotFlagged("no RMS norm in a BatchNorm net", says="rms_norm"),
    ),
)

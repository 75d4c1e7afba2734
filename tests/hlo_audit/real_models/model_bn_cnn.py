"""flax.linen CNN with BatchNorm in train mode (batch_stats mutable), trained
with optax adam, as flax's examples/imagenet writes its train step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, HW, CH, CLASSES = 16, 16, 3, 10


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(16, (3, 3))(x)  # <conv1>
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)  # <bn1>
    x = nn.relu(x)  # <relu1>
    x = nn.Conv(32, (3, 3), strides=(2, 2))(x)  # <conv2>
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)  # <bn2>
    x = nn.relu(x)  # <relu2>
    x = x.mean(axis=(1, 2))  # <gap>
    return nn.Dense(CLASSES)(x)  # <head>


model = CNN()
tx = optax.adam(1e-3)


def train_step(params, batch_stats, opt_state, x, y):
  def loss_fn(params):
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats},  # <apply>
                                  x, train=True, mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, updates["batch_stats"]
  (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), new_stats, opt_state, loss


def build():
  x = jnp.zeros((BATCH, HW, HW, CH), jnp.float32)
  variables = model.init(jax.random.key(0), x, train=False)
  params, stats = variables["params"], variables["batch_stats"]
  return jax.jit(train_step), (params, stats, tx.init(params), x,
                               jnp.zeros((BATCH,), jnp.int32))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same big
# kernels; only scalar-stat fusions differ). Convolutions run as library
# calls (conv, __ynn_fusion) writing NHWC f32; BatchNorm statistics are two
# reductions over (N, H, W) producing f32[C] -- a batch norm, not a layer
# norm -- and the weight-gradient convolutions read transposed copies that
# XLA:CPU makes for its convolution library on purpose.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_A1 = f"f32[{BATCH},{HW},{HW},16]"  # conv1 activations
_A2 = f"f32[{BATCH},{HW // 2},{HW // 2},32]"  # conv2 activations
_B1 = BATCH * HW * HW * 16 * 4

TRUTH = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, _A1, "conv1", why=(
            "conv1 output read back by the bias add and by the centering fusion")),
        Expect(K.UNFUSED_EPILOGUE, _A2, "conv2", why=(
            "conv2 output read back by the bias add and by the centering fusion")),
        Expect(K.UNFUSED_EPILOGUE, _A1, "conv2", bytes=2 * _B1, why=(
            "conv2's input-gradient convolution read once by the relu1-backward "
            "fusion")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[16,3,3,32]", "conv2", why=(
            "conv2's weight gradient read by adam's mu and nu kernels")),
        Expect(K.SEPARATE_REDUCTION, _A1, "bn1", says="recompute x_hat", why=(
            "x - mean written in the forward pass only for BN1's dgamma reduce "
            "(dy * (x - mean) over N, H, W): recomputable from x and the mean")),
        Expect(K.SEPARATE_REDUCTION, _A2, "bn2", says="recompute x_hat", why=(
            "x - mean written in the forward pass only for BN2's dgamma reduce")),
        Expect(K.SEPARATE_REDUCTION, _A1, "conv1", why=(
            "conv1 + bias re-read by the BatchNorm mean and mean-of-squares "
            "reductions over (N, H, W): batch statistics, no layer norm")),
        Expect(K.SEPARATE_REDUCTION, _A2, "conv2", why=(
            "conv2 + bias re-read by BatchNorm's two statistics reductions")),
        Expect(K.SEPARATE_REDUCTION, _A2, "bn2", count=3, why=(
            "BN2 apply written only for relu + global-average-pool's reduce; a "
            "BN2-backward term written only for its reduce; BN2's dx re-read by "
            "conv2's bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _A2, "relu2", why=(
            "relu2-backward dy re-read by BN2's dgamma and dbeta reductions")),
        Expect(K.SEPARATE_REDUCTION, _A1, "relu1", why=(
            "relu1-backward dy re-read by BN1's dgamma and dbeta reductions")),
        Expect(K.SEPARATE_REDUCTION, _A1, "bn1", count=2, why=(
            "a BN1-backward term written only for its reduce; BN1's dx re-read "
            "by conv1's bias-gradient reduce")),
        Expect(K.UNFUSED_PROLOGUE, _A1, "relu1", why=(
            "BatchNorm apply + relu written only for conv2: a prologue of the "
            "convolution")),
        Expect(K.EXPANDED_BROADCAST, _A2, None, why=(
            "relu2's zero broadcast to f32[16,8,8,32] materialized for the "
            "pooling reduce fusion")),
        # Judged with the suite's every-finding rule (read off the HLO):
        Expect(K.LAYOUT_CONFLICT, "f32[16,16,16,16]", "conv1", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[3,16,16,16]", "conv1", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[8,8,16,32]", "conv2", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.UNDONATED_ARGUMENT, None, "bn1", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNFUSED_EPILOGUE, "f32[3,3,3,16]", "conv1", why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_PROLOGUE, "f32[16,16,16,16]", "conv1", why=(
            "a norm's apply written only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[16,32]", "gap", why=(
            "a scaled value written only for the matmuls that read it")),
    ),
    not_flagged=(
        NotFlagged("BatchNorm statistics reduce over batch and space to f32[C]: "
                   "no layer_norm kernel computes that", says="layer_norm"),
        NotFlagged("no RMS norm in a BatchNorm net", says="rms_norm"),
        NotFlagged("XLA:CPU transposes operands of its weight-gradient and "
                   "backward-data convolutions on purpose: not safe to drop",
                   kind=K.LAYOUT_CONFLICT, verdict="safe"),
        NotFlagged("a transpose feeding a convolution is no matmul prologue",
                   says="pallas_kernels.matmul", kind=K.LAYOUT_CONFLICT),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/bn_cnn.hlo.gz, jax
# 0.12). Both forward convolutions are cuDNN's fused convolution
# (__cudnn$convBiasActivationForward: the bias in the call), their filters
# transposed to OHWI for cuDNN; BatchNorm's statistics are one kernel
# reducing (N, H, W) of the convolution's result; BN1's apply and relu are
# written with conv2's asymmetric padding; the backward passes run cuDNN's
# backward-input and backward-filter convolutions.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, _A1, "conv1", says="batch_norm_stats", bytes=_B1, why=(
            "conv1's result re-read by BN1's mean and mean-of-squares reduce over "
            "(N, H, W)")),
        Expect(K.SEPARATE_REDUCTION, _A2, "conv2", says="batch_norm_stats", why=(
            "conv2's result re-read by BN2's statistics")),
        Expect(K.SEPARATE_REDUCTION, _A1, "relu1", says="column_reduction", why=(
            "relu1-backward dy written only for BN1's backward kernel, which "
            "reduces it (dbeta) beside dgamma's term")),
        Expect(K.SEPARATE_REDUCTION, _A2, "relu2", says="column_reduction", why=(
            "relu2-backward dy written only for BN2's backward kernel")),
        Expect(K.SEPARATE_REDUCTION, _A1, "bn1", says="column_reduction", count=3, why=(
            "BN1's dgamma term written only for its reduce; a BN1 backward term "
            "re-read by its sum; BN1's dx re-read by conv1's bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _A2, "bn2", says="column_reduction", count=3, why=(
            "the same three boundaries of BN2")),
        Expect(K.SEPARATE_REDUCTION, _A2, "relu2", says="dims {1} of [16,64,32]", why=(
            "BN2's apply and relu written only for global average pooling's reduce "
            "over H and W")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{HW + 1},{HW + 1},16]", "relu1",
               says="pad", why=(
                   "BN1's apply and relu written, zero-padded for conv2's stride-2 "
                   "SAME padding, only for conv2 and its backward-filter "
                   "convolution: a prologue of the convolution")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HW + 1},{HW + 1},16]", "conv2",
               says="slice", bytes=2 * BATCH * (HW + 1) ** 2 * 16 * 4, why=(
                   "conv2's backward-input convolution (padded like conv2's input) "
                   "read once by relu1's backward, which takes its interior")),
        Expect(K.UNFUSED_EPILOGUE, "f32[32,3,3,16]", "conv2", says="outputs:3", why=(
            "conv2's weight gradient (OHWI) read once by the adam fusion that "
            "transposes it back to HWIO and writes the parameter and moments")),
        Expect(K.LAYOUT_CONFLICT, "f32[32,3,3,16]", "conv2", says="transpose", why=(
            "conv2's filter transposed HWIO -> OHWI for cuDNN on purpose (kept)")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the optimizer state is returned updated but not donated")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "params and batch_stats are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("cuDNN's fused convolution applies the bias itself",
                   kind=K.UNFUSED_EPILOGUE, evidence="convbiasactivationforward"),
        NotFlagged("BatchNorm statistics reduce over batch and space: no layer_norm "
                   "kernel computes that", says="layer_norm"),
        NotFlagged("no RMS norm in a BatchNorm net", says="rms_norm"),
        NotFlagged("cuDNN takes the filter in OHWI: the transpose is not safe to drop",
                   kind=K.LAYOUT_CONFLICT, verdict="safe"),
    ),
)

"""equinox token mixer with a LayerNorm over two axes (`eqx.nn.LayerNorm((N,
D))`: statistics over a whole [N, D] sample), trained with optax adam the way
equinox's examples write a step (filter_value_and_grad, filter_jit)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

BATCH, TOKENS, DIM, OUT = 16, 64, 128, 10


class Mixer(eqx.Module):
  proj: eqx.nn.Linear
  norm: eqx.nn.LayerNorm
  head: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.proj = eqx.nn.Linear(DIM, DIM, key=k1)
    self.norm = eqx.nn.LayerNorm((TOKENS, DIM))
    self.head = eqx.nn.Linear(DIM, OUT, key=k2)

  def __call__(self, x):
    h = jax.vmap(self.proj)(x)  # <proj>
    h = self.norm(jax.nn.gelu(h))  # <norm>
    return self.head(h.mean(axis=0))  # <head>


@eqx.filter_value_and_grad
def compute_loss(model, x, y):
  logits = jax.vmap(model)(x)  # <vmap>
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()  # <loss>


optim = optax.adam(1e-3)


@eqx.filter_jit
def make_step(model, opt_state, x, y):
  loss, grads = compute_loss(model, x, y)  # <grad>
  updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))  # <optax>
  model = eqx.apply_updates(model, updates)  # <apply>
  return model, opt_state, loss


def step():
  """The step as equinox runs it, and its arguments."""
  model = Mixer(jax.random.key(0))
  opt_state = optim.init(eqx.filter(model, eqx.is_array))
  x = jnp.zeros((BATCH, TOKENS, DIM), jnp.float32)
  y = jnp.zeros((BATCH,), jnp.int32)
  return make_step, (model, opt_state, x, y)


def build():
  # eqx.filter_jit itself: the audit lowers it (its `.lowered` is jax's stage),
  # for this machine or for a target.
  return step()


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# The LayerNorm((64, 128)) computes its statistics in ynn fusions reducing
# dims {1,2} of f32[16,64,128] (8192 elements per statistic) and applies a
# [64,128] scale and offset: no last-axis norm kernel computes that. Its
# normalized output feeds both the forward mean over tokens (dims {1}, the
# batch axis kept) and, in the backward pass, the dgamma sum over the batch
# (dims {0}); gelu's backward and the LayerNorm's backward terms are each
# written for a reduce of their own.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

TRUTH = ModelTruth(
    expect=(
        Expect(K.LAYOUT_CONFLICT, "f32[128,1024]", "proj", count=2, why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.EXPANDED_BROADCAST, "f32[16,64,128]", "head", why=(
            "broadcast: a compact value broadcast to full size in a kernel of its own")),
        Expect(K.EXPANDED_BROADCAST, "f32[16,64,128]", "norm", why=(
            "broadcast: a compact value broadcast to full size in a kernel of its own")),
        Expect(K.UNFUSED_EPILOGUE, "f32[128,1024]", "proj", why=(
            "outputs:1: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[128,128]", "proj", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[10,128]", "head", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_PROLOGUE, "f32[16,128]", "head", why=(
            "scale: elementwise work written to memory only for the matmuls that read it")),
        Expect(K.SEPARATE_REDUCTION, "f32[16,64,128]", "norm", says="layer_norm", why=(
            "layer_norm: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[16,64,128]", "norm", says="norm_backward", count=2, why=(
            "norm_backward: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[16,64,128]", "norm", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[16,64,128]", "norm", count=3, why=(
            "x_hat read by the forward mean over tokens and the backward dgamma sum; two LayerNorm backward terms each written for their reduces")),
        Expect(K.SEPARATE_REDUCTION, "f32[16,128]", "head", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "dynamic_nodonate['first'][0]: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
    ),
    not_flagged=(
        NotFlagged("the norm reduces dims {1,2} with a [64,128] scale: a last-axis "
                   "layer_norm kernel computes other statistics", says="pallas_kernels.layer_norm"),
        NotFlagged("no batch norm here: the pooled mean keeps the batch axis",
                   evidence="batch-norm"),
        NotFlagged("no rms norm here", says="rms_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/eqx_layernorm2d.hlo.gz,
# jax 0.12). The projection is one gemm writing [128, 1024] (features by
# tokens); bias + gelu is a kernel of its own; the LayerNorm((64, 128)) is a
# mean kernel, then a kernel writing x - mean with the variance sum, then
# the apply fused with the mean over tokens; its statistics reduce dims
# {1,2} of [16,64,128] with a [64,128] scale.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{BATCH * TOKENS}]", "proj", says="gelu", why=(
            "the projection read back by bias + gelu, and by the gelu backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{OUT},{DIM}]", "head", says="outputs:3", why=(
            "the head's weight gradient read once by its adam fusion")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{TOKENS},{DIM}]", "norm",
               says="no kernel yet", why=(
                   "gelu's output re-read by the norm's mean and by its variance "
                   "kernel: statistics over dims {1,2}, which no last-axis kernel "
                   "computes")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{TOKENS},{DIM}]", "norm",
               says="column_reduction", why=(
                   "gelu-backward dz re-read by the projection's bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{TOKENS},{DIM}]", "norm",
               says="dims {1,2} of [16,64,128]", why=(
                   "a LayerNorm backward term re-read by its sum over the sample")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{DIM}]", "head", says="dims {1} of [16,8192]",
               why=("the pooled gradient re-read by the norm's backward sums and its "
                    "scale and offset gradients")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "the step returns this state updated but does not donate it")),
    ),
    not_flagged=(
        NotFlagged("the norm reduces dims {1,2} with a [64,128] scale: a last-axis "
                   "layer_norm kernel computes other statistics",
                   says="pallas_kernels.layer_norm"),
        NotFlagged("no batch norm here: the statistics keep the batch axis",
                   evidence="batch-norm"),
        NotFlagged("no rms norm here", says="rms_norm"),
    ),
)

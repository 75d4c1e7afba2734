"""flax.nnx small ViT encoder trained with nnx.Optimizer (adamw), jitted the
functional way the nnx docs show (nnx.split / nnx.merge under jax.jit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

BATCH, PATCHES, PATCH_DIM, DIM, HEADS, CLASSES = 8, 16, 48, 64, 4, 10
EPS = 1e-5  # LayerNorm epsilon of ViTs ported from PyTorch (nnx's default: 1e-6)


class Block(nnx.Module):
  def __init__(self, dim, heads, rngs):
    self.norm1 = nnx.LayerNorm(dim, epsilon=EPS, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim,
                                       decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, epsilon=EPS, rngs=rngs)
    self.fc1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.fc2 = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm1(x))  # <attn>
    h = nnx.gelu(self.fc1(self.norm2(x)))  # <mlp1>
    return x + self.fc2(h)  # <mlp2>


class ViT(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Linear(PATCH_DIM, DIM, rngs=rngs)
    self.pos = nnx.Param(jnp.zeros((1, PATCHES, DIM)))
    self.blocks = nnx.List([Block(DIM, HEADS, rngs)])
    self.norm = nnx.LayerNorm(DIM, epsilon=EPS, rngs=rngs)
    self.head = nnx.Linear(DIM, CLASSES, rngs=rngs)

  def __call__(self, x):
    x = self.embed(x) + self.pos  # <embed>
    for block in self.blocks:
      x = block(x)  # <block>
    x = self.norm(x).mean(axis=1)  # <pool>
    return self.head(x)  # <head>


def loss_fn(model, x, y):
  logits = model(x)  # <forward>
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def build():
  model = ViT(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def train_step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)  # <grad>
    optimizer.update(model, grads)  # <update>
    return nnx.state((model, optimizer)), loss

  x = jnp.zeros((BATCH, PATCHES, PATCH_DIM), jnp.float32)
  y = jnp.zeros((BATCH,), jnp.int32)
  return jax.jit(train_step), (state, x, y)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same large
# kernels). One block: three LayerNorms (statistics: a mean and a mean-of-
# squares reduce over the feature axis), separate q/k/v LinearGeneral dots
# whose bias and head transpose run in loop fusions, a fused scores+exp
# kernel, gelu MLP, mean-pool head, adamw. The LayerNorm backward broadcasts
# its scale and its rstd to [8,16,64] in kernels of their own.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_T = f"f32[{BATCH},{PATCHES},{DIM}]"  # tokens
_R = f"f32[{BATCH * PATCHES},{DIM}]"  # tokens as matmul rows

TRUTH = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, _T, "embed", says="eps=1e-05", why=(
            "embed + pos re-read by norm1's mean and mean-of-squares reduces: "
            "a layer norm (pallas_kernels.layer_norm, eps 1e-05 as in the HLO)")),
        Expect(K.SEPARATE_REDUCTION, _T, "attn", says="eps=1e-05", why=(
            "x + attn re-read by norm2's statistics: a layer norm")),
        Expect(K.SEPARATE_REDUCTION, _T, "mlp2", says="eps=1e-05", why=(
            "x + mlp re-read by the final norm's statistics: a layer norm")),
        Expect(K.EXPANDED_BROADCAST, _T, "attn", count=2, why=(
            "norm1's scale [64] and rstd [8,16] broadcast to [8,16,64] for its "
            "backward reductions")),
        Expect(K.EXPANDED_BROADCAST, _T, "mlp1", count=2,
               why="norm2's scale and rstd broadcast to [8,16,64]"),
        Expect(K.EXPANDED_BROADCAST, _T, "pool", count=3, why=(
            "final norm's scale and rstd broadcast to [8,16,64]; mean-pool's "
            "gradient broadcast over the 16 tokens")),
        Expect(K.UNFUSED_EPILOGUE, _R, "attn", count=8, why=(
            "q, k, v projections read back by bias + head transpose; out "
            "projection by bias + residual; the three input-gradient dots of "
            "q, k, v summed by one add; the out projection's input gradient "
            "read by two head transposes")),
        Expect(K.UNFUSED_EPILOGUE, _R, "embed", why="patch embedding read back by bias + pos"),
        Expect(K.UNFUSED_EPILOGUE, _R, "mlp2", why="fc2 read back by bias + residual"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * PATCHES},{4 * DIM}]", "mlp1", why=(
            "fc1 read back by bias + gelu (two kernels) and the gelu backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * PATCHES},{4 * DIM}]", "mlp2",
               bytes=2 * BATCH * PATCHES * 4 * DIM * 4,
               why="fc2's input gradient read once by the gelu backward"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{PATCHES},{4 * DIM}]", "mlp1", why=(
            "gelu-backward dz re-read by fc1's bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[1,{BATCH},{HEADS},{PATCHES},{PATCHES}]", "attn",
               says="softmax", why="exp(scores - max) re-read by the softmax sum"),
        Expect((K.LAYOUT_CONFLICT, K.UNFUSED_PROLOGUE), f"f32[{DIM},{DIM}]", None, count=4,
               why="q, k, v and out kernels transposed into buffers of their own "
               "for the input-gradient dots"),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{HEADS},{PATCHES},{PATCHES}]", "attn",
               count=2, why="normalized probabilities (scaled, one transposed) "
               "written only for the PV dot and the dV dot"),
        # Judged with the suite's every-finding rule (read off the HLO):
        Expect(K.LAYOUT_CONFLICT, "f32[128,64]", "attn", count=4, why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[256,128]", "mlp1", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[64,128]", "attn", count=4, why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[64,128]", "mlp1", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[64,128]", "pool", why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.LAYOUT_CONFLICT, "f32[8,4,16,16]", "attn", count=2, why=(
            "a transpose materialized only for the dot that reads it (weights or activations transposed for a backward dot), or kept for the convolution library")),
        Expect(K.SEPARATE_REDUCTION, "f32[128,64]", "attn", says="column_reduction", why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[128,64]", "mlp1", says="column_reduction", why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,4,1,16]", "attn", why=(
            "a value re-read by a reduce over the axes the evidence names")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,4,16]", "attn", says="column_reduction", count=2, why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "attn", says="column_reduction", count=2, why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "attn", says="norm_backward", why=(
            "a layer norm's backward term re-read by its row reduce")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "mlp1", says="column_reduction", why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "mlp1", says="norm_backward", why=(
            "a layer norm's backward term re-read by its row reduce")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "mlp1", why=(
            "a value re-read by a reduce over the axes the evidence names")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "pool", says="column_reduction", why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "pool", says="norm_backward", count=2, why=(
            "a layer norm's backward term re-read by its row reduce")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,16,64]", "pool", count=2, why=(
            "a value re-read by a reduce over the axes the evidence names")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,4,16,16]", "attn", why=(
            "a value re-read by a reduce over the axes the evidence names")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,64]", "mlp2", why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[48,64]", "embed", why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[64,10]", "head", why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[64,256]", "mlp1", why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[64,64]", "attn", count=4, why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,4,16,16]", "attn", count=3, why=(
            "a matmul result (a weight gradient read by the optimizer's moments, attention scores read by transposes) read elementwise by several kernels")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,4,16,16]", "attn", why=(
            "a matmul result read once by a transpose")),
        Expect(K.UNFUSED_PROLOGUE, "f32[128,64]", "attn", why=(
            "a norm's apply written only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[128,64]", "mlp1", why=(
            "a norm's apply written only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[8,4,16,16]", "attn", why=(
            "a norm's apply written only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[8,4,16,16]", "attn", why=(
            "a scaled value written only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[8,64]", "pool", why=(
            "a scaled value written only for the matmuls that read it")),
    ),
    not_flagged=(
        NotFlagged("no RMS norm in this model: LayerNorm backward reductions "
                   "(dgamma, dbeta) and its broadcasts are not rms_norm", says="rms_norm"),
        NotFlagged("the HLO's epsilon is 1e-05", says="eps=1e-06"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/nnx_vit.hlo.gz, jax
# 0.12). Dots are Triton gemm fusions, most split-K; the LayerNorms' applies
# and biases run as the gemms' prologues, and the residual stream is never
# written: each reader recomputes embed + pos + attention out. Attention is
# gemm -> XLA's Triton softmax (one kernel) -> gemm, forward and backward.
# The LayerNorms' statistics: norm1's re-read the embedding gemm's result,
# norm2's the attention output gemm's split-K partial sums (which the
# statistics and the apply each sum again), the final norm's are computed in
# the kernel that finishes fc2.
_TOK = f"f32[{BATCH},{PATCHES},{DIM}]"
_HEADS = f"f32[{BATCH * HEADS},{PATCHES},{PATCHES}]"  # per-head scores

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, _HEADS, "attn", says="dot_product_attention",
               bytes=4 * BATCH * HEADS * PATCHES * PATCHES * 4, why=(
                   "scores (q @ k^T) written, the Triton softmax writes the "
                   "probabilities, the PV gemm reads them: gemm -> softmax -> gemm, "
                   "which only a fused attention kernel keeps on chip")),
        Expect(K.SEPARATE_REDUCTION, _HEADS, "attn", says="attention", why=(
            "backward: dP (dO @ v^T) written, the Triton softmax backward writes "
            "dS, the dQ and dK gemms read it")),
        Expect(K.SEPARATE_REDUCTION, _R, "embed", says="layer_norm", why=(
            "the embedding gemm's result re-read by norm1's mean and "
            "mean-of-squares reduce (with pos added on load)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[4,{BATCH * PATCHES},{DIM}]", "attn",
               says="layer_norm", why=(
                   "the attention output gemm's split-K partial sums re-read by "
                   "norm2's statistics, which sum them again (as its apply does)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{PATCHES},{4 * DIM}]", "mlp1",
               says="column_reduction", why=(
                   "gelu-backward dz re-read by fc1's bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _TOK, None, says="column_reduction", count=5, why=(
            "LayerNorm backward terms written beside their row reductions and "
            "re-read by the gamma-gradient reduces over the tokens (norm1, norm2, "
            "the final norm); norm2's input gradient re-read by the attention "
            "output's bias gradient and norm1's by the pos and embedding bias "
            "gradients")),
        Expect(K.UNFUSED_PROLOGUE, _TOK, "pool", says="affine", why=(
            "the final norm's input gradient (its backward's per-row affine) "
            "written only for fc2's two backward gemms and the kernel finishing "
            "their split-K sums, which also sums fc2's bias gradient from it: "
            "each could compute it on load")),
        Expect(K.SEPARATE_REDUCTION, _R, None, says="column_reduction", count=2, why=(
            "a LayerNorm's dy (the split-K sum of the input gradients) written "
            "by its row-reduction kernel and re-read by the beta-gradient "
            "reduce")),
        Expect(K.SEPARATE_REDUCTION, _TOK, "pool", says="dims {1} of [8,16,64]", why=(
            "the final norm's apply written only for the mean-pool over tokens")),
        Expect(K.SEPARATE_REDUCTION, _HEADS, "attn", says="dims {0,2} of [8,4,16,16]",
               count=2, why=(
                   "dQ and dK re-read by the query and key bias-gradient reduces "
                   "over batch and tokens")),
        Expect(K.SEPARATE_REDUCTION, _HEADS, "attn", says="dims {0,3} of [8,4,16,16]",
               why="dV (transposed) re-read by the value bias-gradient reduce"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{DIM}]", "head", says="norm_backward",
               why=("the pooled gradient re-read by the final norm's backward "
                    "row sums and its beta-gradient reduce")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * PATCHES},{4 * DIM}]", "mlp2",
               bytes=2 * BATCH * PATCHES * 4 * DIM * 4,
               why="fc2's input gradient read once by the gelu backward"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * PATCHES},{4 * DIM}]", "mlp1",
               says="gelu", why=(
                   "fc1 (norm2's apply and the bias as its prologue) read back by "
                   "gelu, and by the gelu backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{CLASSES}]", "head", says="outputs:3",
               why="the head's weight gradient read once by its adamw fusion"),
        Expect(K.UNFUSED_PROLOGUE, _TOK, "attn", says="affine", why=(
            "norm1's apply written only for the QKV gemm and its weight-gradient "
            "gemm")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{HEADS},{DIM // HEADS},{BATCH},{PATCHES}]", "attn",
               count=3, why=(
                   "dQ, dK and dV transposed to [heads, dim, batch, tokens] only for "
                   "the QKV weight-gradient gemm, which contracts batch and tokens")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it")),
    ),
    not_flagged=(
        NotFlagged("XLA's Triton softmax is one kernel: a softmax kernel removes "
                   "nothing", says="pallas_kernels.softmax"),
        NotFlagged("a LayerNorm's variance clamp max(E[x^2] - E[x]^2, 0) is no relu",
                   says="activation:relu"),
        NotFlagged("no RMS norm in this model", says="rms_norm"),
        NotFlagged("the HLO's epsilon is 1e-05", says="eps=1e-06"),
        NotFlagged("a split-K sum is part of its gemm: no reduction over 4 partial "
                   "sums", evidence="(4 elements each)"),
    ),
)

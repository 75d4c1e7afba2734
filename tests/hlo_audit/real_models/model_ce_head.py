"""A language model's output head trained alone, as mixed-precision LM
training writes it: hidden states [4, 64, 64] -> `nn.Dense(dtype=bfloat16)`
to a 32768-word vocabulary (f32 params, a bf16 matmul) -> the logits cast
to f32 for optax's integer-label softmax cross-entropy -> mean, the
gradient taken for the head's parameters and the hidden states (what flows
back into the trunk), optax adam. The f32 logits [4, 64, 32768] (32 MiB)
and their gradient are what the step is made of."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, SEQ, DIM, VOCAB = 4, 64, 64, 32768

head = nn.Dense(VOCAB, dtype=jnp.bfloat16, name="lm_head")
tx = optax.adam(1e-3)


def train_step(params, opt_state, hidden, labels):
  def loss_fn(params, hidden):
    logits = head.apply({"params": params}, hidden)  # <logits>
    logits = logits.astype(jnp.float32)  # <upcast>
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # <xent>
    return loss.mean()  # <mean>
  loss, (grads, d_hidden) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, hidden)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss, d_hidden  # <update>


def build():
  hidden = jnp.zeros((BATCH, SEQ, DIM), jnp.float32)
  params = head.init(jax.random.key(0), hidden)["params"]
  labels = jnp.zeros((BATCH, SEQ), jnp.int32)
  return jax.jit(train_step), (params, tx.init(params), hidden, labels)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2 and 0.12.0.1 compiled
# here; 0.11 and 0.12 give the same kernels). The params, the bias and the
# hidden states are cast to bf16 by kernels of their own; the logits dot
# (x @ W, [256, 32768]) is read by three kernels that each add the bias and
# widen: one writes the f32 logits only for the row max, one writes
# exp(logits - max) for the row sum and the softmax gradient, one gathers
# the label's logit for the loss. The gradient: softmax * dloss written by an
# elementwise kernel, the integer label's -1/N scattered into it in place
# (`wrapped_scatter`), then cast to bf16 by a kernel of its own (the
# transpose of `.astype(f32)`), which the input-gradient dot, a transpose for
# the weight-gradient dot and a kernel widening it back to f32 for the bias
# gradient's reduce read. Adam updates each moment and the parameter in
# kernels of their own.
#
# jax 0.10 widens every bf16 dot operand to f32 (the cast params and hidden
# states rounded to bf16 and back, the dlogits widened again for the dots)
# and rounds each dot's f32 result to bf16 in a kernel of its own: more
# casts, f32 buffers where 0.11 has bf16 ones.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (NATIVE_BF16_DOT, Expect,  # noqa: E402
                                               ModelTruth, NotFlagged)

_LOGITS = f"f32[{BATCH},{SEQ},{VOCAB}]"
_TOK = BATCH * SEQ
_GRAD_F32 = Expect(None, _LOGITS, "xent", says="scatter", why=(
    "the cross-entropy's gradient softmax * dloss, with -1/N scattered in place at "
    "each label (the scatter's output), read only by the kernel casting it to "
    "bf16 (and, on an H200, summing the bias gradient): computing the one-hot "
    "term elementwise (iota == label) in the kernel writing softmax * dloss and "
    "casting there removes the f32 gradient's write and read (64 MiB), "
    "leaving the bf16 one"))
_UNDONATED = Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=3, why=(
    "params and the optimizer state are returned updated but not donated; "
    "the hidden states' buffer could hold their gradient (same shape, last "
    "read before it is written)"))

if NATIVE_BF16_DOT:
  _BY_VERSION = (
      Expect(K.LAYOUT_CONFLICT, f"bf16[{VOCAB},{_TOK}]", "upcast", says="transpose", why=(
          "the bf16 dlogits transposed only for the weight-gradient dot x^T @ "
          "dlogits, which could contract the tokens in place")),
      Expect(K.UNFUSED_EPILOGUE, f"bf16[{DIM},{VOCAB}]", "logits", says="outputs:2", why=(
          "the weight gradient (bf16 out of the dot) read by adam's mu and nu "
          "kernels")),
      Expect(K.UNFUSED_EPILOGUE, f"bf16[{_TOK},{DIM}]", "logits", says="cast:f32", why=(
          "dlogits @ W^T read once by its cast to the f32 gradient the step "
          "returns")),
      Expect(K.UNFUSED_PROLOGUE, f"bf16[{DIM},{VOCAB}]", "logits", says="cast", why=(
          "W cast to bf16, read only by the logits dot and the input-gradient dot")),
      Expect(K.UNFUSED_PROLOGUE, f"bf16[{_TOK},{DIM}]", "logits", says="cast", why=(
          "the hidden states cast to bf16, read only by the logits dot and the "
          "weight-gradient dot")),
  )
else:
  _BY_VERSION = (
      Expect(K.LAYOUT_CONFLICT, f"f32[{VOCAB},{_TOK}]", "logits", says="transpose", why=(
          "0.10: the widened dlogits transposed only for the weight-gradient dot")),
      Expect(K.STANDALONE_COPY, f"bf16[{_TOK},{VOCAB}]", "logits", says="dtype conversion",
             why=("0.10: the logits dot's f32 result rounded to bf16 by a kernel "
                  "of its own, read by the three kernels widening it again")),
      Expect(K.STANDALONE_COPY, f"bf16[{VOCAB},{DIM}]", "optax", says="dtype conversion",
             why="0.10: the weight gradient rounded to bf16, read by adam's moments"),
      Expect(K.UNFUSED_EPILOGUE, f"f32[{_TOK},{VOCAB}]", "logits", says="cast:bf16",
             why="0.10: x @ W read once by its rounding to bf16"),
      Expect(K.UNFUSED_EPILOGUE, f"f32[{VOCAB},{DIM}]", "logits", says="cast:bf16",
             why="0.10: the weight gradient read once by its rounding to bf16"),
      Expect(K.UNFUSED_EPILOGUE, f"f32[{_TOK},{DIM}]", "logits", says="cast:bf16",
             why="0.10: dlogits @ W^T read once by its rounding (and widening back)"),
      Expect(K.UNFUSED_PROLOGUE, f"f32[{_TOK},{VOCAB}]", "logits", says="cast", why=(
          "0.10: the bf16 dlogits widened to f32 only for the input-gradient dot")),
      Expect(K.UNFUSED_PROLOGUE, f"f32[{DIM},{VOCAB}]", "logits", says="cast", why=(
          "0.10: W rounded to bf16 and widened, read only by two dots")),
      Expect(K.UNFUSED_PROLOGUE, f"f32[{_TOK},{DIM}]", "logits", says="cast", why=(
          "0.10: the hidden states rounded to bf16 and widened, read only by two "
          "dots")),
  )

TRUTH = ModelTruth(
    expect=_BY_VERSION + (
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "logits", says=f"{VOCAB} elements", why=(
            "logits + bias widened to f32 and written only for the row max")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "xent", says=f"{VOCAB} elements", why=(
            "exp(logits - max) re-read by the row sum (and by the softmax "
            "gradient's kernel)")),
        Expect(K.STANDALONE_COPY, f"bf16[{BATCH},{SEQ},{VOCAB}]", "upcast",
               says="dtype conversion", why=(
                   "the f32 dlogits cast to bf16 by a kernel of its own, read by the "
                   "input-gradient dot, the transpose and the widening for the bias "
                   "gradient")),
        Expect(K.STANDALONE_COPY, _LOGITS, "upcast", says="dtype conversion", why=(
            "the bf16 dlogits widened back to f32 only for the bias gradient's "
            "reduce, which could widen on load")),
        Expect(K.STANDALONE_COPY, f"bf16[{VOCAB}]", "logits", says="dtype conversion", why=(
            "the bias cast to bf16 by a kernel of its own, read by the three "
            "kernels adding it to the logits")),
        _GRAD_F32,
        _UNDONATED,
    ),
    not_flagged=(
        NotFlagged("the f32 input gradient is the step's output, written whatever "
                   "happens: what the cast's fusion removes is the dot's bf16 result "
                   "before it (the dot's epilogue)", kind=K.STANDALONE_COPY,
                   evidence="read by the program's output"),
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact "
                   "to remove", evidence="converted back", numerical="EXACT"),
        NotFlagged("no norm in this model", says="norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/ce_head.hlo.gz, jax
# 0.12). The logits gemm writes bf16 [256, 32768]; four kernels re-read it,
# each adding the bias and widening: the row max and the exp-sum as
# two-stage (tree) reductions over the 32768 words, the loss's label gather,
# and softmax * dloss (f32, written). The label's -1/N is scattered into
# that buffer in place (`input_scatter_fusion`), and one kernel casts the
# result to bf16 and sums the bias gradient from it
# (`input_convert_reduce_fusion`); the input-gradient gemm is split-K, the
# weight-gradient gemm writes bf16 for one adam fusion (parameter and both
# moments).
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{DIM},{VOCAB}]", "logits", says="outputs:3", why=(
            "the weight gradient read once by its adam fusion (parameter, mu, nu)")),
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{DIM},{VOCAB}]", "logits", says="cast", why=(
            "W cast to bf16, read only by the logits gemm and the input-gradient "
            "gemm")),
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{BATCH},{SEQ},{DIM}]", "logits", says="cast", why=(
            "the hidden states cast to bf16, read only by the logits gemm and the "
            "weight-gradient gemm")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{_TOK},{VOCAB}]", "logits",
               says=f"{VOCAB} elements", why=(
                   "the logits re-read by the row max, whose two stages (dims {2} "
                   "of [256,128,256], then {1} of [256,128] by the next kernel) "
                   f"reduce all {VOCAB} words of a row")),
        _GRAD_F32,
        _UNDONATED,
    ),
    not_flagged=(
        NotFlagged("a tree reduction's first stage is not the statistic: the row "
                   f"max reduces {VOCAB} elements, not 256",
                   shape=f"bf16[{_TOK},{VOCAB}]", evidence="(256 elements each)"),
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact "
                   "to remove", evidence="converted back", numerical="EXACT"),
        NotFlagged("no norm in this model", says="norm"),
    ),
)

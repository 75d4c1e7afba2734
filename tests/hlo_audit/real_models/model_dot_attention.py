"""A multi-head causal self-attention block's train step around
`jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=...)`:
bf16 weights and activations, q/k/v/o projections, an f32 squared-error
loss, gradients w.r.t. the four weights, optax sgd, jitted. `build()` uses
`implementation="xla"` (JAX's own einsum -> mask -> softmax -> einsum, which
XLA:CPU compiles); `step()` the same step with `implementation="cudnn"`
(cuDNN's fused flash attention: XLA:GPU calls it as one custom call forward
and one backward), which is what the H200 compile holds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

BATCH, SEQ, HEADS, HEAD_DIM = 4, 128, 4, 32
DIM = HEADS * HEAD_DIM
DTYPE = jnp.bfloat16

tx = optax.sgd(1e-2)


def attention_block(params, x, implementation):
  def heads(w):
    return (x @ w).reshape(BATCH, SEQ, HEADS, HEAD_DIM)  # <proj>
  q, k, v = heads(params["wq"]), heads(params["wk"]), heads(params["wv"])  # <qkv>
  out = jax.nn.dot_product_attention(q, k, v, is_causal=True,  # <attention>
                                     implementation=implementation)
  return out.reshape(BATCH, SEQ, DIM) @ params["wo"]  # <o_proj>


def make_train_step(implementation):
  def train_step(params, opt_state, x, y):
    def loss_fn(params):
      out = attention_block(params, x, implementation)  # <block>
      return jnp.mean((out.astype(jnp.float32) - y) ** 2)  # <loss>
    loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
    updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
    return optax.apply_updates(params, updates), opt_state, loss  # <update>
  return jax.jit(train_step)


def _args():
  keys = jax.random.split(jax.random.key(0), 4)
  params = {name: (jax.random.normal(key, (DIM, DIM)) / jnp.sqrt(DIM)).astype(DTYPE)
            for name, key in zip(("wq", "wk", "wv", "wo"), keys)}
  x = jnp.zeros((BATCH, SEQ, DIM), DTYPE)
  y = jnp.zeros((BATCH, SEQ, DIM), jnp.float32)
  return params, tx.init(params), x, y


def build():
  """The step with XLA's attention (what XLA:CPU compiles)."""
  return make_train_step("xla"), _args()


def step():
  """The step with cuDNN's fused attention (for the H200 compile)."""
  return make_train_step("cudnn"), _args()


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2 and 0.12.0.1). q, k and v are
# three dots; JAX's attention is the scores dot (f32), one kernel scaling by
# 1/sqrt(d) and masking, max + exp, the sum, the normalization to bf16 and the
# PV dot, with q, k, v and the probabilities transposed by kernels of their
# own into the layouts the batched dots want (q and k also widened to f32,
# for dk and dq). Backward: dO = dOut @ w_o^T transposed twice, dP, the
# rowsum(dP * P) reduce, dS computed twice (once per layout, for dq and dk),
# and each of dq, dk, dV transposed (and rounded to bf16) for its weight
# gradient, which sgd's update reads. By version: jax 0.10 widens every bf16
# dot operand to f32 (x and the weights by kernels of their own), rounds
# each dot's result to bf16 in a kernel of its own (q, k, v, dO, dP) or in
# its reader, and widens it back for the next dot; from 0.11 the dots run in
# bf16 and write bf16.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (NATIVE_BF16_DOT, Expect,  # noqa: E402
                                               ModelTruth, NotFlagged, per_version)

_A = "bf16" if NATIVE_BF16_DOT else "f32"  # what the dots (and 0.10's round trips) write
_S = f"[{BATCH},{HEADS},{SEQ},{SEQ}]"
_BHTD = f"[{BATCH},{HEADS},{SEQ},{HEAD_DIM}]"
_BHDT = f"[{BATCH},{HEADS},{HEAD_DIM},{SEQ}]"
_TOK = f"[{BATCH * SEQ},{DIM}]"

TRUTH = ModelTruth(
    expect=(
        # Layout conflicts: XLA attributes a transpose to the projection's
        # reshape or to the attention call depending on the version (both
        # make it), so their lines go unchecked.
        Expect(K.LAYOUT_CONFLICT, f"{_A}{_S}", None, says="transpose", why=(
            "the probabilities transposed to [b, h, tk, tq] only for the PV dot")),
        Expect(K.LAYOUT_CONFLICT, f"f32{_BHTD}", None, says="transpose",
               count=per_version(3, 2, 2), why=(
                   "q and k widened to f32 and transposed to [b, h, t, d] only for "
                   "the dk and dq dots; 0.10: dO too, for dP")),
        Expect(K.LAYOUT_CONFLICT, f"bf16{_BHTD}", None, says="transpose",
               count=per_version(1, 2, 2), why=(
                   "q transposed for the scores dot; from 0.11 dO too, for dP")),
        Expect(K.LAYOUT_CONFLICT, f"bf16{_BHDT}", None, says="transpose",
               count=per_version(1, 3, 3), why=(
                   "k transposed to [b, h, d, t] for the scores dot; from 0.11 v "
                   "(for the PV dot and dP) and dO (for dV) too")),
        Expect(K.LAYOUT_CONFLICT, f"f32{_BHDT}", None, says="transpose",
               count=per_version(2, 0, 0), why="0.10: v and dO, widened and transposed"),
        Expect(K.LAYOUT_CONFLICT, f"{_A}[{DIM},{BATCH * SEQ}]", None, says="transpose",
               count=4, why=(
                   "dV, dq, dk (rounded to bf16) and dOut transposed to "
                   "[h*d, b*t] only for the weight-gradient dots")),
        Expect(K.LAYOUT_CONFLICT, f"{_A}{_TOK}", None, says="transpose", why=(
            "the heads' output [b, h, d, t] transposed to [b*t, h*d] only for "
            "w_o's dot and its weight gradient")),
        Expect(K.STANDALONE_COPY, f"bf16{_TOK}", "proj", says="conversion",
               count=per_version(3, 0, 0),
               why="0.10: q, k, v rounded to bf16 by a convert kernel each"),
        Expect(K.STANDALONE_COPY, f"bf16{_TOK}", "o_proj", says="conversion",
               count=per_version(1, 0, 0), why="0.10: dO rounded to bf16 by a convert kernel"),
        Expect(K.STANDALONE_COPY, f"bf16{_S}", "attention", says="conversion",
               count=per_version(1, 0, 0), why="0.10: dP rounded to bf16 by a convert kernel"),
        Expect(K.UNFUSED_EPILOGUE, f"f32{_S}", "attention", says="mask", why=(
            "the scores read once by the kernel scaling them by 1/sqrt(d) and "
            "masking the future")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}{_S}", "attention", says="cast:", why=(
            "dP read by its cast (0.10: to bf16, for every reader; from 0.11: to "
            "f32 for the rowsum, beside dS's kernels that need the rowsum)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32{_BHTD}", "attention",
               says="cast:bf16" if NATIVE_BF16_DOT else "round:bf16", count=2,
               why=("dq and dk read once by their rounding to bf16 and transpose "
                    "(0.10: widened back, the transposed copy is f32: a rounding, "
                    "not the output's dtype)")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}{_BHDT}", "attention", says="transpose", count=2,
               why=("the PV output and dV^T read once by their transpose (0.10: "
                    "and rounding); from 0.11 a transpose only, the same bf16 "
                    "values fused or not")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}{_TOK}", "o_proj", says="residual", why=(
            "the block's output read once by out.astype(f32) - y (0.10: rounded "
            "to bf16 first): its result is f32")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}{_TOK}", "o_proj", why=(
            "dO read by its rounding (0.10) or by its two transposes (from 0.11: "
            "outputs:2)")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}{_TOK}", "proj", count=3, why=(
            "q, k, v: 0.10 read once by their rounding to bf16; from 0.11 q and k "
            "read by two transposing kernels each (one widening to f32 for the "
            "backward, which reads nothing else: outputs:2), v by one "
            "transpose")),
        Expect(K.UNFUSED_EPILOGUE, f"{_A}[{DIM},{DIM}]", None, says="residual", count=4, why=(
            "each weight gradient read once by sgd's update w - lr * g "
            "(rounded to bf16 on the way; 0.10: transposed before the weight "
            "is added): an epilogue adding the weight and writing bf16 (MISSED "
            "on 0.10: an add after the transpose is not named the residual)")),
        Expect(K.UNFUSED_PROLOGUE, f"f32{_S}", "attention", says="affine", count=2, why=(
            "dS = (dP / sum - rowsum) * exp, masked and scaled, written once per "
            "layout, each only for the dq or the dk dot")),
        Expect(K.UNFUSED_PROLOGUE, f"f32{_S}", "attention", says="cast",
               count=per_version(1, 0, 0),
               why="0.10: the bf16 probabilities widened only for dV's dot"),
        Expect(K.UNFUSED_PROLOGUE, f"f32{_TOK}", "proj", says="cast", count=per_version(1, 0, 0),
               why="0.10: x widened to f32 for its six dots"),
        Expect(K.UNFUSED_PROLOGUE, f"f32{_TOK}", "o_proj", says="cast",
               count=per_version(1, 0, 0), why="0.10: dOut widened for dO's dot"),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{DIM},{DIM}]", None, says="cast",
               count=per_version(4, 0, 0), why="0.10: each weight widened for its dots"),
        Expect(K.SEPARATE_REDUCTION, f"f32[1,{BATCH},{HEADS},{SEQ},{SEQ}]", "attention",
               says="softmax", count=2, why=(
                   "the masked scores re-read by the max (+ exp) kernel; exp(s - "
                   "max) re-read by the sum (and the normalization, the backward)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[1,{BATCH},{HEADS},{SEQ},{SEQ}]", "attention",
               says="dims {4}", why="dP widened to f32 only for rowsum(dP * P)"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{SEQ},{DIM}]", "loss",
               says="sum_of_squares", why=(
                   "out - y re-read by the loss's sum of squares (and by the "
                   "gradient's kernel)")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why="the weights not donated"),
    ),
    not_flagged=(
        NotFlagged("q's and k's widened transposed copies (for dk and dq) read only "
                   "the projection: the kernels are in the backward pass but need "
                   "no gradient, so both readers could be the dot's epilogue "
                   "(outputs:2)", kind=K.UNFUSED_EPILOGUE, marker="proj",
                   evidence="values computed from the whole result"),
        NotFlagged("sgd's update writes the bf16 weight: a matmul writing f32 would "
                   "change the parameter's dtype", kind=K.UNFUSED_EPILOGUE,
                   shape=f"bf16[{DIM},{DIM}]", says="out_dtype=jnp.float32"),
        NotFlagged("a transpose moves no arithmetic onto the f32 accumulator: the "
                   "fused store writes the same bf16 values", kind=K.UNFUSED_EPILOGUE,
                   numerical="MORE_PRECISE", evidence="once to apply transpose;"),
        NotFlagged("0.10: out - y is f32 (out rounded to bf16, widened, y "
                   "subtracted): a matmul writing bf16 drops its precision",
                   kind=K.UNFUSED_EPILOGUE, shape=f"f32{_TOK}", marker="o_proj",
                   says="out_dtype=jnp.bfloat16", evidence="apply residual"),
        NotFlagged("0.10: sgd's update adds the weight to the scaled gradient: a "
                   "matmul that only scales and casts leaves that kernel",
                   kind=K.UNFUSED_EPILOGUE, shape=f"f32[{DIM},{DIM}]",
                   evidence="apply scale, transpose, cast:bf16;"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/dot_attention.hlo.gz, jax
# 0.12, the step with implementation="cudnn"). q, k and v are one Triton gemm
# (x @ [wq | wk | wv], [512, 384]) whose three column blocks are copied out by
# a slice kernel each, read by cuDNN's fused attention
# (`__cudnn$fmhaSoftmax`: the output and the softmax statistics) and its
# backward (`__cudnn$fmhaSoftmaxBackward`: dq, dk, dv): no scores, no
# probabilities in memory. w_o's gemm is split-K, finished by the kernel
# computing out - y, the loss's partial sums and dOut; dO's gemm and the
# weight gradients are split-K too, the latter finished by sgd's updates
# (already fused); dq, dk and dv are one gemm's operands ([8, 128, 384]).
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH * SEQ},{3 * DIM}]", "proj", says="split:3",
               bytes=2 * BATCH * SEQ * 3 * DIM * 2, why=(
                   "x @ [wq | wk | wv] copied out by three slice kernels (q, k, v "
                   "for cuDNN): the gemm could write the three outputs")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "wq, wk, wv not donated (w_o is read after its update is written)")),
    ),
    not_flagged=(
        NotFlagged("the attention is cuDNN's fused flash attention (one custom call "
                   "forward, one backward): no gemm -> softmax -> gemm chain to "
                   "fuse", says="attention"),
        NotFlagged("the softmax runs inside cuDNN's fused attention: no reduction "
                   "kernel reads the attention's buffers",
                   kind=K.SEPARATE_REDUCTION, marker="attention"),
    ),
)

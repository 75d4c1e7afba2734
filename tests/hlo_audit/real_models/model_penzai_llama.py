"""penzai's Llama-style transformer (`llamalike_common.build_llamalike_transformer`
with a small Llama config: RMSNorm, rotary embeddings, causal attention,
SwiGLU MLP, untied lm_head) trained on next-token cross-entropy over `pz.nx`
named arrays, the way penzai's `basic_training` writes its step: the
parameters unbound from the model (`pz.unbind_params`) and frozen, the loss
differentiated with `jax.grad` w.r.t. their values, the model rebound to
them (`pz.bind_variables`), optax adam, jitted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from penzai import pz
from penzai.models.transformer.variants import llamalike_common

BATCH, SEQ, VOCAB, DIM, LAYERS, HEADS, HIDDEN = 4, 32, 256, 64, 2, 4, 128

CONFIG = llamalike_common.LlamalikeTransformerConfig(
    num_kv_heads=HEADS, query_head_multiplier=1, embedding_dim=DIM,
    projection_dim=DIM // HEADS, mlp_hidden_dim=HIDDEN, num_decoder_blocks=LAYERS,
    vocab_size=VOCAB, mlp_variant="swiglu", tie_embedder_and_logits=False)

optimizer = optax.adam(1e-3)


def xent_loss(model, tokens):
  logits = model(tokens)  # <apply>
  losses = pz.nx.nmap(optax.softmax_cross_entropy_with_integer_labels)(  # <xent>
      logits[{"seq": pz.slice[:-1]}].untag("vocabulary"),  # <logit_slice>
      tokens[{"seq": pz.slice[1:]}])  # <targets>
  return losses.untag("batch", "seq").unwrap().mean()  # <mean>


def train_step(unbound_model, params, opt_state, tokens):
  def loss_fn(params):
    model = pz.bind_variables(unbound_model, params)  # <bind>
    return xent_loss(model, tokens)

  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = optimizer.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss  # <apply_updates>


def build():
  model = llamalike_common.build_llamalike_transformer(CONFIG, init_base_rng=jax.random.key(0))
  unbound_model, params = pz.unbind_params(model)
  params = pz.freeze_params(params)
  tokens = pz.nx.wrap(jnp.zeros((BATCH, SEQ), jnp.int32)).tag("batch", "seq")
  return jax.jit(train_step), (unbound_model, params, optimizer.init(params), tokens)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2 and 0.12.0.1; the same kernels
# but for the rotary embedding, below). Every finding inside penzai's model
# cites the `model(tokens)` line; JAX's name stack says which layer: penzai's
# `Sequential` names each sublayer's scope by its index, so layers read as
# index paths ("1/0/1/0": body[1] = block 0, its attention residual, the
# attention, the first sublayer of one of its `Sequential`s).
#
# penzai's named axes cost transposes: `nmap` moves the mapped axes around,
# so XLA writes the embedding rows [b, t, e] transposed to [e, b, t] for the
# first norm's sum of squares, each norm's x_hat and dy transposed for the
# gamma gradients, and q, k, v, the scores, the probabilities and the head
# outputs in the layouts each einsum wants ([b, h, p, t], [b, h, t, p],
# [tq, tkv, b, h], ...). Per block: the RMSNorm's sum of squares re-reads the
# residual stream, its apply is written for the q/k/v dots (and their weight
# gradients); q and k are rotated by a kernel of their own (0.10: one kernel
# slicing the halves and concatenating; 0.12: a kernel per rotated half and
# a concatenate op) before the transposes; the scores are masked by a
# transposing kernel, max + exp is one kernel, exp is transposed for the sum;
# the probabilities exp * (1 / sum) are written twice, transposed for the PV
# dot and for dV; SwiGLU is sigmoid, silu and the product, each a kernel
# reading the gate or up dot. The loss slices the logits to [:, :31], takes
# max, exp and sum, and its gradient is scattered (the -1 at the targets)
# and padded back to 32 positions twice (one pad per reader). adam's moments
# are one kernel each per weight gradient, the update a third. Backward, each
# norm's dx̂ * x rowsum and dy * x_hat gamma gradient reduce a transposed
# copy written for them; dq and dk are un-rotated by two kernels each (one per
# layout their readers want).
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (Expect, ModelTruth,  # noqa: E402
                                               NotFlagged, per_version)

_X = f"f32[{BATCH * SEQ},{DIM}]"  # [b*t, e]
_XT = f"f32[{DIM},{BATCH},{SEQ}]"  # [e, b, t]: the embedding axis first
_RES = f"f32[{BATCH},{SEQ},{DIM}]"  # the residual stream
_HD = DIM // HEADS
_SCORES = f"f32[{BATCH},{HEADS},{SEQ},{SEQ}]"
_LOGITS = f"f32[{BATCH},{SEQ - 1},{VOCAB}]"

TRUTH = ModelTruth(
    expect=(
        Expect(K.LAYOUT_CONFLICT, f"f32[{DIM},{DIM}]", "apply", count=4 * LAYERS, why=(
            "wq, wk, wv ([64, 4, 16] -> [4, 16, 64]) and wo ([4, 16, 64] -> "
            "[64, 4, 16]) transposed by a kernel each only for the backward dot "
            "giving the input gradient")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{DIM},{BATCH * SEQ}]", "apply", count=10, why=(
            "activations' gradients transposed to [e, b*t] only for a weight "
            "gradient dot: the norm backward dx for dW_down (2) and dW_o (2), the "
            "head outputs' gradient for dW_v (2), the un-rotated dq and dk for "
            "dW_q and dW_k (4)")),
        Expect(K.LAYOUT_CONFLICT, _X, "apply", count=2 * LAYERS, why=(
            "the heads' output [b, h, p, t] -> [b*t, h*p] for w_o's dot and its "
            "weight gradient; dV^T the same for the input-gradient dot")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{HEADS},{_HD},{SEQ}]", "apply",
               count=2 * LAYERS, why=(
                   "v -> [b, h, p, t] for the PV dot and dP; the attention "
                   "output's gradient -> [b, h, p, t] for dV")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{HEADS},{SEQ},{_HD}]", "apply",
               count=2 * LAYERS, why=(
                   "the rotated k -> [b, h, t, p] for the scores and dq; the "
                   "attention output's gradient -> [b, h, t, p] for dP")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{VOCAB},{BATCH * SEQ}]", "logit_slice", why=(
            "the padded logits' gradient transposed only for lm_head's weight "
            "gradient dot")),
        Expect(K.STANDALONE_COPY, f"f32[{SEQ},{BATCH},{HEADS},{SEQ}]", "apply",
               says="layout", count=LAYERS, why=(
                   "exp(s - max) [tq, tkv, b, h] transposed to [tq, b, h, tkv] by "
                   "a copy kernel, read by the sum and by the backward rowsum: "
                   "both reduce over tkv and could read it in place")),
        Expect(K.MATERIALIZED_SLICE, f"f32[{BATCH},{SEQ},{HEADS},{_HD}]", "apply",
               says="concatenate", count=per_version(0, 2 * LAYERS, 2 * LAYERS), why=(
                   "0.12: the rotated halves of q and k joined by a concatenate op "
                   "read only by the transposing kernels after it")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{SEQ},{SEQ},{BATCH},{HEADS}]", "apply",
               count=LAYERS, why=(
                   "the scores transposed and masked by a kernel of their own, "
                   "re-read by the max (+ exp) kernel")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{SEQ},{BATCH},{HEADS},{SEQ}]", "apply",
               count=LAYERS, why=(
                   "dP transposed by a kernel only for the softmax backward's "
                   "rowsum(dP * P)")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "xent", why=(
            "exp(logits - max) re-read by the sum and by the gradient")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "logit_slice", why=(
            "the logits' first 31 positions copied by a kernel only for the max")),
        Expect(K.SEPARATE_REDUCTION, _RES, "apply", says="rms_norm", count=2 * LAYERS, why=(
            "the residual stream (after each attention and MLP add) re-read by "
            "the next RMSNorm's sum of squares")),
        Expect(K.SEPARATE_REDUCTION, _XT, "apply", says="rms_norm", why=(
            "MISSED: the embedding rows transposed to [e, b, t] "
            "(copy_bitcast_fusion.33) only for the first RMSNorm's sum of "
            "squares over e (dims {0}): per token, not per channel; called "
            "batch-norm statistics")),
        Expect(K.SEPARATE_REDUCTION, _RES, "apply", says="dims {2}", count=2 * LAYERS + 1,
               why=("each norm's dy * gamma written only for the rowsum of x * "
                    "dx_hat in its backward")),
        Expect(K.SEPARATE_REDUCTION, _XT, "apply", says="recompute x_hat",
               count=2 * LAYERS + 1, why=(
                   "x * rsqrt(mean(x^2) + eps), transposed, written in the forward "
                   "pass only for the gamma gradient's sum of dy * x_hat (rule 3)")),
        Expect(K.SEPARATE_REDUCTION, _XT, "apply", says="dims {1,2}", count=2 * LAYERS + 1,
               why=("each norm's dy transposed to [e, b, t] only for the gamma "
                    "gradient's reduce over b and t")),
        Expect(K.UNFUSED_PROLOGUE, _X, "apply", says="scale", count=2 * LAYERS + 1, why=(
            "each norm's apply x * rsqrt(...) * gamma written only for the dots "
            "reading it (q, k, v or gate, up or lm_head, and their weight "
            "gradients)")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{HEADS},{_HD},{SEQ}]", "apply",
               count=LAYERS, why=(
                   "the rotated q scaled by 1/sqrt(d) and transposed only for the "
                   "scores dot")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{HEADS},{SEQ},{_HD}]", "apply",
               count=LAYERS, why=(
                   "the same scaled q in the other layout, only for dk's dot")),
        Expect(K.UNFUSED_PROLOGUE, _SCORES, "apply", says="scale", count=2 * LAYERS, why=(
            "the probabilities exp * (1 / sum), transposed, written once for the "
            "PV dot and once for dV's")),
        Expect(K.UNFUSED_PROLOGUE, _SCORES, "apply", says="affine", count=2 * LAYERS, why=(
            "dS = (dP / sum - rowsum) * exp, masked, written twice (two layouts) "
            "for the dq and dk dots")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH * SEQ},{VOCAB}]", "logit_slice",
               says="pad", why=(
                   "the logits' gradient padded back to 32 positions only for "
                   "lm_head's input-gradient dot")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{HIDDEN}]", "apply",
               says="sigmoid", count=LAYERS, why=(
                   "the gate dot read by sigmoid and silu kernels (and by the "
                   "backward, which needs the gradient)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{HIDDEN}]", "apply",
               says="outputs:1", count=LAYERS, why=(
                   "the up dot read by the silu * up kernel (and by the backward)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{HIDDEN}]", "apply",
               says="outputs:4", count=LAYERS, why=(
                   "dh (dy @ w_down^T) read elementwise by four kernels (d_up, "
                   "d_gate and two transposed copies for the weight gradients)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{VOCAB}]", "apply", says="slice",
               why=("the logits read by the slice kernel for the max; the loss "
                    "kernels need the max first")),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="apply elementwise", why=(
            "w_o's dot (block 0) read once by the residual add with the "
            "embedding rows (transposed there and back)")),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="once to apply residual",
               count=2 * LAYERS - 1, why="w_o (block 1) and w_down read once by the residual add"),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="once to apply transpose", count=LAYERS,
               why="v read once by its transpose to [b, h, p, t]"),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="residual, transpose", count=4 * LAYERS,
               why=("the input gradients of q/k/v and of gate/up, each added to "
                    "the others and transposed by the norm backward's two "
                    "reduction inputs; the norm's dx needs their rowsum")),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says=": transpose;", count=LAYERS,
               why="w_o's input gradients read by two transposing kernels each"),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says=": scale, transpose;",
               count=LAYERS + 1, why=(
                   "the norms' input gradients added to no parameter: lm_head's "
                   "(ynn_fusion.42) and each block's q/k/v leg the other two's sum "
                   "is added to (ynn_fusion.14, .28), each read by two kernels "
                   "that transpose it, one then scaling it by the norm's gamma "
                   "(broadcast along the embedding axis: transpose_copy_fusion.9, "
                   ".21, .33)")),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="scale", count=LAYERS,
               why="w_down's weight gradient read by adam's two moment kernels"),
        Expect(K.UNFUSED_EPILOGUE, _X, "apply", says="slice", count=2 * LAYERS, why=(
            "q and k read only by their rotary embedding: same-row work (each "
            "head's halves) the dot's store could do; 0.12 rotates each half in "
            "a kernel (outputs:2); MISSED on 0.10, where one kernel slices the "
            "halves and concatenates (add_concatenate_fusion.6, .7, .4, .5)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HEADS},{_HD},{SEQ}]", "apply",
               says="outputs:2", count=LAYERS, why="dV read by two transposing kernels"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HEADS},{_HD},{SEQ}]", "apply",
               says="once to apply transpose", count=LAYERS,
               why="the PV dot's output read once by its transpose to [b*t, h*p]"),
        Expect(K.UNFUSED_EPILOGUE, _SCORES, "apply", says="mask", count=LAYERS,
               why="the scores read once by the kernel transposing and masking them"),
        Expect(K.UNFUSED_EPILOGUE, _SCORES, "apply", says="outputs:1", count=LAYERS, why=(
            "dP read by its transpose for the rowsum; dS's kernels need the "
            "rowsum first")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HEADS},{SEQ},{_HD}]", "apply",
               says="slice", count=2 * LAYERS, why=(
                   "MISSED: dq and dk (dS @ k, dS^T @ q) read only by the kernels "
                   "undoing the rotation (0.10: add_concatenate_fusion.3 and "
                   "concatenate_bitcast_fusion.3, one per layout; 0.12: a kernel "
                   "per half): same-row work for the dot's store")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{HIDDEN}]", "apply", count=2 * LAYERS,
               why="the gate and up weight gradients read by adam's two moment kernels"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{VOCAB}]", "apply",
               why="lm_head's weight gradient read by adam's two moment kernels"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{DIM}]", "apply", count=4 * LAYERS, why=(
            "the q, k, v, o weight gradients read (transposed) by adam's two "
            "moment kernels")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat",
               why="the optimizer state (count, mu, nu) not donated"),
        Expect(K.UNDONATED_ARGUMENT, None, "apply_updates", says="donat",
               why="the parameters not donated"),
    ),
    not_flagged=(
        NotFlagged("the first norm's reduce is over dims {0} of the embedding rows "
                   "transposed to [e, b, t] (copy_bitcast_fusion.33): axis 0 is the "
                   "embedding, so it is RMSNorm's per-token sum of squares, not "
                   "batch statistics", kind=K.SEPARATE_REDUCTION, says="batch_norm"),
        NotFlagged("the unbound model's constants (eps, the query scale, the mask "
                   "value) are read every step and not returned: the f32[] output "
                   "their buffer would alias is the loss; donating them deletes the "
                   "model the caller passes again", kind=K.UNDONATED_ARGUMENT,
                   says="unbound_model"),
        NotFlagged("RMSNorm, no LayerNorm", says="layer_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/penzai_llama.hlo.gz, jax
# 0.12). Dots are Triton gemm fusions, most split-K ([k, M, N] partial sums
# finished by their readers). Each norm's gamma is folded into the next
# gemm's operand; the embedding gather is recomputed by each reader of the
# rows; q, k and v are one gemm ([128, 192]) whose readers slice v and
# transpose it, and slice, transpose and rotate q and k; the rotation's cos
# table is broadcast to [4, 4, 8, 32] in memory. Attention is the scores gemm
# -> max, sum and normalize kernels (XLA's Triton softmax is not used here)
# -> the PV gemm; gate and up are one gemm ([128, 256]) read by the SwiGLU
# kernel; the logits gemm writes only the 31 positions the loss reads. adam is
# one kernel per parameter writing it and both moments.
_P4 = f"f32[4,{BATCH * SEQ},{DIM}]"  # 4-way split-K partial sums
_P8 = f"f32[8,{BATCH * SEQ},{DIM}]"
_BHT = f"f32[{BATCH * HEADS},{SEQ},{SEQ}]"

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{SEQ - 1},{VOCAB}]", "xent",
               says="one-hot scatter", why=(
                   "the cross-entropy's softmax * dloss, -1/N scattered in place at "
                   "each row's label (one element a row), read only by the pad back "
                   "to the unsliced logits' shape: the pad could compute the product "
                   "and the one-hot term (iota == label) on load")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{SEQ},{HEADS},{_HD}]", "apply",
               count=LAYERS, why=(
                   "the heads' output [b, h, p, t] (which w_o's gemm reads as it "
                   "is) transposed to [b, t, h, p] only for w_o's weight-gradient "
                   "gemm")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{_HD},{HEADS},{SEQ}]", "apply",
               count=3 * LAYERS, why=(
                   "dV and the un-rotated dq and dk transposed to [b, p, h, t] "
                   "only for the fused q/k/v weight-gradient gemm")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{DIM},{SEQ}]", "apply", count=LAYERS, why=(
            "v cut out of the q/k/v gemm's sum [128, 192] (columns 128:192) and "
            "transposed to [b, h * p, t] by one kernel (input_transpose_fusion.6, "
            ".7), read only by the PV gemm and its backward gemm: both could read "
            "v in place at its offset")),
        Expect(K.EXPANDED_BROADCAST, f"f32[{BATCH},{HEADS},{_HD // 2},{SEQ}]", "apply",
               why=("the rotation's cos table [8, 32] written broadcast to "
                    "[4, 4, 8, 32] and read by the eight rotating kernels")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{3 * DIM}]", "apply",
               says="transpose", count=LAYERS, why=(
                   "MISSED: the q/k/v gemm's sum (loop_reduce_fusion, .1) read by "
                   "three kernels, each slicing its block and transposing it "
                   "(v) or transposing and rotating it (q, k: "
                   "input_concatenate_fusion.6, .7): an epilogue writing the three "
                   "results; reported as a plain column split (split:3), which "
                   "would leave all three kernels in place")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * SEQ},{2 * HIDDEN}]", "apply",
               says="glu multiply:halves activation:silu", count=LAYERS, why=(
                   "x @ [w_gate | w_up] read by the SwiGLU kernel "
                   "(loop_multiply_fusion.4, .5: silu of the first half times the "
                   "second, each half cut out of the result seen as [B, T, 2F]) "
                   "and by the backward, which keeps it stored")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[4,{BATCH * SEQ},{HIDDEN}]", "apply",
               says="outputs:2", count=LAYERS, why=(
                   "MISSED: dh's split-K partial sums (gemm_fusion_dot.111, .118) "
                   "summed again by each of two kernels (d_gate: "
                   "loop_add_fusion.3; d_up: loop_multiply_fusion.2): one kernel "
                   "finishing the gemm could write both")),
        Expect(K.UNFUSED_EPILOGUE, _P4, "apply", says="outputs:2", count=LAYERS, why=(
            "MISSED: the attention output's gradient, split-K partial sums "
            "(gemm_fusion_dot.114, .121), summed again by each of two "
            "transposing kernels (for dP and for dV)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH * HEADS},{_HD},{SEQ}]", "apply",
               says="slice", count=2 * LAYERS, why=(
                   "MISSED: dq and dk (gemm_fusion_dot.98, .99, .102, .103) read "
                   "only by the kernel undoing the rotation "
                   "(input_concatenate_fusion*): same-row work for the gemm's "
                   "store")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[{BATCH},{SEQ},{VOCAB}]", "logit_slice",
               says="pad", why=(
                   "the logits' gradient padded back to 32 positions, read only "
                   "by lm_head's two gradient gemms")),
        Expect(K.UNFUSED_PROLOGUE, _SCORES, "apply", says="affine", count=LAYERS, why=(
            "the probabilities (masked exp(s - max) / sum) written only for the "
            "PV gemm and dV's")),
        Expect(K.UNFUSED_PROLOGUE, _SCORES, "apply", says="affine transpose", count=LAYERS,
               why=(
                   "dS = (dP / sum - rowsum) * exp(s - max), masked, written "
                   "transposed (XLA:GPU's transpose emitter) only for the dq and dk "
                   "gemms: a flash-attention backward forms it per tile")),
        Expect(K.UNFUSED_PROLOGUE, _RES, "apply", says="affine", why=(
            "block 1's attention norm apply written for the q/k/v gemm, its "
            "weight gradient and the gamma gradient's product-reduce (a "
            "contraction); the other norms' applies would make their readers "
            "re-read split-K partial sums or the gathered rows (rule 4)")),
        Expect(K.SEPARATE_REDUCTION, _P4, "apply", says="rms_norm", count=LAYERS, why=(
            "w_o's split-K partial sums re-read by the next norm's sum of "
            "squares, which sums them again (as its apply does)")),
        Expect(K.SEPARATE_REDUCTION, _P8, "apply", says="rms_norm", why=(
            "block 1's w_down partial sums re-read by the final norm's statistics")),
        Expect(K.SEPARATE_REDUCTION, _P8, "apply", says="norm_backward", why=(
            "lm_head's input gradient (split-K) re-read by the final norm's "
            "backward rowsum, its dx and its gamma gradient")),
        Expect(K.SEPARATE_REDUCTION, _P4, "apply", says="norm_backward", count=3, why=(
            "q's, k's and v's input gradients (split-K) re-read by the first "
            "norm's backward rowsum and by the embedding gradient's scatter")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "apply", says="log_softmax", why=(
            "the logits re-read by the max, the sum of exp, the loss and the "
            "gradient")),
        Expect(K.SEPARATE_REDUCTION, _BHT, "apply", bytes=2 * BATCH * HEADS * SEQ * SEQ * 4,
               count=LAYERS, why=(
                   "the scores re-read by the max and the sum kernels (and the "
                   "normalize and the backward)")),
        Expect(K.SEPARATE_REDUCTION, _BHT, "apply", says="contraction", count=LAYERS, why=(
            "dP re-read by rowsum(dP * P), a product summed over the keys, and "
            "by dS's kernel")),
        Expect(K.SEPARATE_REDUCTION, _X, "apply", says="column_reduction", count=4, why=(
            "norm backward terms written beside their row reductions and re-read "
            "by the gamma-gradient reduces over the tokens (rule: a norm's dy "
            "written by its row-reduction kernel)")),
        Expect(K.SEPARATE_REDUCTION, _RES, "apply", says="column_reduction", why=(
            "the first norm's dy * x_hat written beside its rowsum, re-read by "
            "the gamma-gradient reduce")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat",
               why="the optimizer state not donated"),
        Expect(K.UNDONATED_ARGUMENT, None, "apply_updates", says="donat", why=(
            "the parameters whose last read precedes their update's write (the "
            "rest are read after it: XLA would copy)")),
    ),
    not_flagged=(
        NotFlagged("the q/k/v gemm's readers transpose their block and rotate q and "
                   "k, not slice copies: writing three outputs removes no kernel",
                   kind=K.UNFUSED_EPILOGUE, shape=f"f32[{BATCH * SEQ},{3 * DIM}]",
                   says="split:"),
        NotFlagged("the SwiGLU kernel computes silu(gate) * up from the gemm's two "
                   "halves, not a slice", kind=K.UNFUSED_EPILOGUE,
                   shape=f"f32[{BATCH * SEQ},{2 * HIDDEN}]", evidence=": slice)"),
        NotFlagged("RMSNorm, no LayerNorm", says="layer_norm"),
    ),
)

"""dm-haiku transformer language model trained as haiku's
examples/transformer writes it: `hk.transform` of a forward function
embedding tokens (`hk.Embed`) plus learned positions, a stack of pre-norm
blocks (`hk.LayerNorm`, `hk.MultiHeadAttention` under a causal and padding
mask, dropout, an `hk.Linear` -> gelu -> `hk.Linear` MLP), a final
LayerNorm and an untied `hk.Linear` head; the masked log-softmax loss,
`jax.value_and_grad`, optax's clip_by_global_norm + adam, jitted."""

from __future__ import annotations

import dataclasses

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

LAYERS, D_MODEL, HEADS, SEQ, BATCH, VOCAB = 2, 64, 4, 32, 4, 256
DROPOUT = 0.1


def _layer_norm(x):
  return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)  # <ln>


@dataclasses.dataclass
class Transformer(hk.Module):
  """The example's transformer stack."""

  num_heads: int
  num_layers: int
  attn_size: int
  dropout_rate: float
  widening_factor: int = 4
  name: str | None = None

  def __call__(self, embeddings, mask):
    initializer = hk.initializers.VarianceScaling(2 / self.num_layers)
    _, seq_len, model_size = embeddings.shape
    mask = mask[:, None, None, :]
    causal_mask = np.tril(np.ones((1, 1, seq_len, seq_len)))
    mask = mask * causal_mask  # <mask>
    h = embeddings
    for _ in range(self.num_layers):
      attn_block = hk.MultiHeadAttention(num_heads=self.num_heads, key_size=self.attn_size,
                                         model_size=model_size, w_init=initializer)
      h_norm = _layer_norm(h)
      h_attn = attn_block(h_norm, h_norm, h_norm, mask=mask)  # <attn>
      h_attn = hk.dropout(hk.next_rng_key(), self.dropout_rate, h_attn)  # <attn_dropout>
      h = h + h_attn  # <attn_residual>
      dense_block = hk.Sequential([
          hk.Linear(self.widening_factor * model_size, w_init=initializer),
          jax.nn.gelu,
          hk.Linear(model_size, w_init=initializer),
      ])
      h_norm = _layer_norm(h)
      h_dense = dense_block(h_norm)  # <mlp>
      h_dense = hk.dropout(hk.next_rng_key(), self.dropout_rate, h_dense)  # <mlp_dropout>
      h = h + h_dense  # <mlp_residual>
    return _layer_norm(h)  # <final_ln>


def forward_fn(data):
  tokens = data["obs"]
  input_mask = jnp.greater(tokens, 0)
  seq_length = tokens.shape[1]
  embed_init = hk.initializers.TruncatedNormal(stddev=0.02)
  token_embs = hk.Embed(VOCAB, D_MODEL, w_init=embed_init)(tokens)  # <embed>
  positional_embeddings = hk.get_parameter("pos_embs", [seq_length, D_MODEL], init=embed_init)
  input_embeddings = token_embs + positional_embeddings  # <pos>
  transformer = Transformer(num_heads=HEADS, num_layers=LAYERS, attn_size=D_MODEL // HEADS,
                            dropout_rate=DROPOUT)
  output_embeddings = transformer(input_embeddings, input_mask)  # <transformer>
  return hk.Linear(VOCAB)(output_embeddings)  # <head>


forward = hk.transform(forward_fn)
optimizer = optax.chain(optax.clip_by_global_norm(0.25),  # <clip>
                        optax.adam(2e-4, b1=0.9, b2=0.99))


def loss_fn(params, rng, data):
  logits = forward.apply(params, rng, data)  # <apply>
  targets = jax.nn.one_hot(data["target"], VOCAB)
  mask = jnp.greater(data["obs"], 0)
  loss = -jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1)  # <loss>
  return jnp.sum(loss * mask) / jnp.sum(mask)  # <mean>


def update(state, data):
  rng, new_rng = jax.random.split(state["rng"])
  params = state["params"]
  loss, g = jax.value_and_grad(loss_fn)(params, rng, data)  # <grad>
  updates, opt_state = optimizer.update(g, state["opt_state"])  # <optax>
  params = optax.apply_updates(params, updates)  # <apply_updates>
  new_state = {"step": state["step"] + 1, "rng": new_rng, "opt_state": opt_state,
               "params": params}
  return new_state, {"step": state["step"], "loss": loss}


def build():
  tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, VOCAB)
  data = {"obs": tokens, "target": jnp.roll(tokens, -1, axis=1)}
  rng, init_rng = jax.random.split(jax.random.PRNGKey(428))
  params = forward.init(init_rng, data)
  state = {"step": jnp.array(0), "rng": rng, "opt_state": optimizer.init(params),
           "params": params}
  return jax.jit(update), (state, data)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2 and 0.12.0.1: the same kernels).
# haiku's modules live in site-packages: a finding cites the user's line
# that called the module (`attn_block(...)`, `dense_block(...)`,
# `_layer_norm`'s line for every LayerNorm) and names the module in its
# layer (`transformer/multi_head_attention/query`). Per block: LayerNorm is
# a mean reduce of the residual stream, x - mean written for the variance's
# reduce, and its apply written for the q, k, v (or MLP) dots; q, k and v
# are three library dots whose results a kernel each reads to add the bias
# and split the heads (k twice: [b, h, d, t] and [b, h, t, d]); the scores
# are scaled and masked by a kernel of their own, the softmax is max + exp,
# sum, normalize; dropout's random bits come from a threefry while loop (5
# trips) per dropout. Backward: the attention gradients' head transposes,
# LayerNorm's backward reductions (over the features and, for its scale and
# offset, over the tokens) with gamma and 1/std broadcast to [4, 32, 64] for
# them, and optax's clip_by_global_norm summing every gradient's squares
# before adam reads it.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_T = BATCH * SEQ  # tokens
_X = f"f32[{BATCH},{SEQ},{D_MODEL}]"
_X2 = f"f32[{_T},{D_MODEL}]"
_S = f"f32[{BATCH},{HEADS},{SEQ},{SEQ}]"
_LOGITS = f"f32[{BATCH},{SEQ},{VOCAB}]"
_HIDDEN = 4 * D_MODEL

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, f"u32[{BATCH},{SEQ},{D_MODEL}]", "attn_dropout",
               says="loop-carry copy", count=2 * LAYERS, why=(
                   "each dropout's threefry loop copies both carried halves at the "
                   "top of its body (both kernels writing the new halves read both "
                   "old ones)")),
        Expect(K.STANDALONE_COPY, f"u32[{BATCH},{SEQ},{D_MODEL}]", "mlp_dropout",
               says="loop-carry copy", count=2 * LAYERS, why="the same, MLP dropout"),
        Expect(K.EXPANDED_BROADCAST, _X, "ln", count=2 * (2 * LAYERS + 1), why=(
            "each LayerNorm's scale ([64]) and 1/std ([4, 32]) broadcast to "
            "[4, 32, 64] for the backward multiply-reduces")),
        Expect(K.LAYOUT_CONFLICT, None, "attn", says="transpose", count=18, why=(
            "attention's head transposes (q, k, v and their gradients) and the "
            "activations transposed for the projections' weight-gradient dots")),
        Expect(K.LAYOUT_CONFLICT, f"f32[{D_MODEL},{_T}]", "attn_dropout", says="transpose",
               count=LAYERS, why="the dropped-out attention gradient transposed for o's "
                                 "weight-gradient dot"),
        Expect(K.LAYOUT_CONFLICT, f"f32[{_HIDDEN},{_T}]", "mlp", says="transpose",
               count=LAYERS, why="gelu's backward transposed for the first MLP dot's "
                                 "weight gradient"),
        Expect(K.LAYOUT_CONFLICT, f"f32[{D_MODEL},{_T}]", "mlp_dropout", says="transpose",
               count=LAYERS, why="the dropped-out MLP gradient transposed for the second "
                                 "MLP dot's weight gradient"),
        Expect(K.LAYOUT_CONFLICT, f"f32[{VOCAB},{_T}]", "loss", says="transpose", why=(
            "the logits' gradient transposed for the head's weight-gradient dot")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HEADS},{SEQ},{SEQ}]", "attn",
               says="scale mask", count=LAYERS, why=(
                   "q @ k^T read once by the kernel scaling by 1/sqrt(16) and masking")),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="outputs:2 bias transpose", count=LAYERS,
               why="k's projection read by two kernels adding the bias and splitting "
                   "the heads in two layouts"),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="bias transpose", count=2 * LAYERS,
               why="q's and v's projections read once by the bias + head split"),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="bias mask", count=LAYERS, why=(
            "the output projection read once by the bias + dropout kernel")),
        Expect(K.UNFUSED_EPILOGUE, _X2, "mlp", says="bias mask", count=LAYERS, why=(
            "the second MLP dot read once by the bias + dropout kernel")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{_T},{_HIDDEN}]", "mlp", says="gelu", count=LAYERS,
               why=("the first MLP dot read by gelu's tanh kernel and gelu's product "
                    "(gelu's backward reads it too)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{_T},{_HIDDEN}]", "mlp", says="elementwise",
               count=LAYERS, why="the second MLP dot's input gradient read once by "
                                 "gelu's backward"),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="outputs:2 transpose", count=LAYERS,
               why="o's input gradient read by two kernels splitting it into heads"),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="residual", count=2 * LAYERS, why=(
            "k's and v's input gradients read once by the kernel summing q's, k's "
            "and v's")),
        Expect(K.UNFUSED_EPILOGUE, _X2, "attn", says="elementwise", count=LAYERS, why=(
            "q's input gradient read once by the same sum")),
        Expect(K.UNFUSED_EPILOGUE, None, "attn", says="outputs:3 transpose", count=3 * LAYERS,
               why=("dQ, dK and dV read by three kernels each merging the heads (for "
                    "the input gradient, the weight gradient and the bias gradient)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{HEADS},{D_MODEL // HEADS},{SEQ}]", "attn",
               says="transpose pallas_kernels.matmul", count=LAYERS, why=(
                   "p @ v read once by the kernel merging the heads")),
        Expect(K.UNFUSED_EPILOGUE, _LOGITS, "loss", says="outputs:1", why=(
            "ynn_fusion.76 (the head dot, its bias and log_softmax's max, minus the "
            "max) read by exp's kernel (the log_softmax backward reads it too)")),
        Expect(K.UNFUSED_PROLOGUE, _X2, "ln", says="affine", count=2 * LAYERS + 1, why=(
            "each LayerNorm's apply written only for the dots reading it")),
        Expect(K.UNFUSED_PROLOGUE, _S, "attn", says="scale", count=LAYERS, why=(
            "the normalized probabilities exp * (1 / sum) written only for p @ v and "
            "dV's dot")),
        Expect(K.UNFUSED_PROLOGUE, _S, "attn", says="affine", count=LAYERS, why=(
            "the scores' gradient (softmax backward, mask, 1/sqrt(16)) written only "
            "for dQ's and dK's dots")),
        Expect(K.SEPARATE_REDUCTION, _X, "ln", says="layer_norm", count=2 * LAYERS + 1, why=(
            "x - mean written only for the variance's reduce over the features")),
        Expect(K.SEPARATE_REDUCTION, _X, "attn_residual", says="layer_norm", count=LAYERS,
               why="the residual stream after attention re-read by the next "
                   "LayerNorm's mean"),
        Expect(K.SEPARATE_REDUCTION, _X, "mlp_residual", says="layer_norm", count=LAYERS,
               why="the residual stream after the MLP re-read by the next (or the "
                   "final) LayerNorm's mean"),
        Expect(K.SEPARATE_REDUCTION, _X, "pos", says="layer_norm", why=(
            "token + position embeddings re-read by the first LayerNorm's mean")),
        Expect(K.SEPARATE_REDUCTION, _X, "ln", says="norm_backward", count=2 * LAYERS + 1,
               why="dy * gamma re-read by LayerNorm's backward sum over the features"),
        Expect(K.SEPARATE_REDUCTION, _X, "ln", says="batch axis 0 kept",
               count=2 * (2 * LAYERS + 1), why=(
                   "dy * (x - mean) re-read by the backward's sum over the features "
                   "and the scale's gradient; the variance's backward term re-read "
                   "by its sum")),
        Expect(K.SEPARATE_REDUCTION, _X, "ln", says="column_reduction", why=(
            "the first LayerNorm's dx re-read by the position embedding's gradient "
            "(a sum over the batch)")),
        Expect(K.SEPARATE_REDUCTION, _X, "attn", says="column_reduction", count=3 * LAYERS,
               why="dQ, dK, dV with the heads merged re-read by the bias gradients"),
        Expect(K.SEPARATE_REDUCTION, _X2, "attn", says="column_reduction", count=LAYERS,
               why="the q + k + v input-gradient sum re-read by LayerNorm's backward "
                   "reductions"),
        Expect(K.SEPARATE_REDUCTION, _X, "attn_dropout", says="column_reduction",
               count=LAYERS, why="dropout's backward re-read by o's bias gradient"),
        Expect(K.SEPARATE_REDUCTION, _X, "mlp_dropout", says="column_reduction",
               count=LAYERS, why="dropout's backward re-read by the second MLP dot's "
                                 "bias gradient"),
        Expect(K.SEPARATE_REDUCTION, _X2, "mlp", says="column_reduction", count=LAYERS,
               why="the first MLP dot's input gradient re-read by LayerNorm's backward"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{SEQ},{_HIDDEN}]", "mlp",
               says="column_reduction", count=LAYERS, why=(
                   "gelu's backward re-read by the first MLP dot's bias gradient")),
        Expect(K.SEPARATE_REDUCTION, _X2, "head", says="column_reduction", why=(
            "the head's input gradient re-read by the final LayerNorm's backward")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "loss", says="column_reduction", why=(
            "the logits' gradient re-read by the head's bias gradient")),
        Expect(K.SEPARATE_REDUCTION, _S, "attn", says="softmax", count=2 * LAYERS, why=(
            "the scaled, masked scores re-read by max + exp; exp re-read by the sum")),
        Expect(K.SEPARATE_REDUCTION, _S, "attn", says="batch axis 0 kept", count=LAYERS, why=(
            "dP = dO @ v^T re-read by the softmax backward's sum of dP * P")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "loss", says="batch axis 0 kept", count=3, why=(
            "exp(logits - max) re-read by log_softmax's sum; targets * log_softmax "
            "and its backward re-read by their sums over the vocabulary")),
        Expect(K.SEPARATE_REDUCTION, None, None, says="sum_of_squares", count=13, why=(
            "each dot's weight gradient re-read by clip_by_global_norm's sum of "
            "squares (and by adam's kernels)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{SEQ},{D_MODEL}]", "optax", says="total", why=(
            "the position embedding's squared gradient written only for its sum")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the state is returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the embedding gradient is a scatter-add into a zero table (the "
                   "broadcast is the scatter's destination, updated in place): its sum "
                   "of squares needs every row's accumulated sum, so it cannot run in "
                   "the scatter", kind=K.SEPARATE_REDUCTION, marker="embed"),
        NotFlagged("no RMS norm here: haiku's LayerNorm centers", says="rms_norm"),
        NotFlagged("no BatchNorm here", says="batch_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/haiku_lm.hlo.gz, jax
# 0.12). Each LayerNorm is one Triton kernel (forward; backward with its
# gamma and beta sums); q, k and v are one gemm ([128, 192], split-K, each
# slice summed and transposed into heads by a kernel of its own), their
# biases added inside the attention gemms from [4, 64, 32] broadcasts;
# attention is gemm -> Triton softmax -> gemm, forward and backward; the
# MLP's gemms carry the bias; the head's logits go to a Triton log-softmax.
# Most weight gradients are split-K gemms whose finishing reduce writes the
# gradient that clip_by_global_norm squares and sums and adam reads; q's, k's
# and v's weight gradients are one gemm over the concatenated gradients
# ([64, 192]).
_QKV = f"f32[{D_MODEL},{3 * D_MODEL}]"

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.LAYOUT_CONFLICT, f"f32[{BATCH},{SEQ},{HEADS},{D_MODEL // HEADS}]", "attn",
               says="transpose", count=4 * LAYERS, why=(
                   "dQ, dK, dV transposed for the QKV weight-gradient gemm, and p @ v "
                   "transposed for the output projection (forward and its weight "
                   "gradient)")),
        Expect(K.EXPANDED_BROADCAST, f"f32[{BATCH},{D_MODEL},{SEQ}]", "attn",
               count=3 * LAYERS, why=(
                   "q's, k's and v's biases ([64]) broadcast to [4, 64, 32] for the "
                   "attention gemms that add them to their operands")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{_T},{_HIDDEN}]", "mlp", says="gelu", count=LAYERS,
               why=("the first MLP gemm (bias in the gemm) read by gelu's kernel "
                    "(gelu's backward reads it too)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{_T},{_HIDDEN}]", "mlp", says="elementwise",
               count=LAYERS, why="the second MLP gemm's input gradient read once by "
                                 "gelu's backward"),
        Expect(K.SEPARATE_REDUCTION, _QKV, "attn", says="sum_of_squares", count=LAYERS, why=(
            "loop_reduce_fusion.8, .11 (finishing the QKV weight-gradient gemm) "
            "re-read by three kernels each squaring and summing one slice "
            "(clip_by_global_norm) and by adam's kernel: slices reduced are no "
            "elementwise epilogue")),
        Expect(K.SEPARATE_REDUCTION, f"f32[8,{_T},{D_MODEL}]", "mlp", says="layer_norm", why=(
            "the second MLP gemm's split-K partial sums re-read by the Triton "
            "LayerNorm kernels, each summing them again (no norm kernel missing: "
            "the split-K sum finished once removes the re-reads)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH * HEADS},{SEQ},{SEQ}]", "attn",
               says="attention", count=2 * LAYERS, why=(
                   "gemm -> Triton softmax -> gemm, forward (the scores) and backward "
                   "(dP): a fused attention kernel keeps them on chip")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{_T},{VOCAB}]", "head", says="log_softmax", why=(
            "the logits (bias in the gemm) re-read by the Triton log-softmax")),
        Expect(K.SEPARATE_REDUCTION, _LOGITS, "loss", says="column_reduction", why=(
            "the logits' gradient re-read by the head's bias gradient")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{SEQ},{_HIDDEN}]", "mlp",
               says="column_reduction", count=LAYERS, why=(
                   "gelu's backward re-read by the first MLP gemm's bias gradient")),
        Expect(K.SEPARATE_REDUCTION, _X, "ln", says="column_reduction", count=2, why=(
            "the first LayerNorm's dx re-read by the position embedding's gradient; "
            "the final LayerNorm's gamma term re-read by its sum")),
        Expect(K.SEPARATE_REDUCTION, _X, "attn_dropout", says="column_reduction",
               count=LAYERS, why="dropout's backward (in the Triton LayerNorm backward) "
                                 "re-read by o's bias gradient"),
        Expect(K.SEPARATE_REDUCTION, _X, "mlp_dropout", says="column_reduction",
               count=LAYERS, why="dropout's backward re-read by the second MLP gemm's "
                                 "bias gradient"),
        Expect(K.SEPARATE_REDUCTION, _X2, "attn", says="column_reduction", count=LAYERS,
               why="the q + k + v input-gradient sum re-read by LayerNorm's beta "
                   "gradient"),
        Expect(K.SEPARATE_REDUCTION, _X2, "mlp", says="column_reduction", count=LAYERS,
               why="the first MLP gemm's input gradient (split-K finished) re-read by "
                   "LayerNorm's beta gradient"),
        Expect(K.SEPARATE_REDUCTION, _X2, "head", says="column_reduction", why=(
            "the head's input gradient re-read by the final LayerNorm's beta gradient")),
        Expect(K.SEPARATE_REDUCTION, None, None, says="sum_of_squares", count=7, why=(
            "weight gradients (split-K finished) re-read by clip_by_global_norm's sum "
            "of squares and by adam's kernels")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH * HEADS},{D_MODEL // HEADS},{SEQ}]", "attn",
               says="dims {0,3}", count=LAYERS, why=(
                   "dV re-read by v's bias gradient over batch and tokens")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH * HEADS},{SEQ},{D_MODEL // HEADS}]", "attn",
               says="dims {0,2}", count=2 * LAYERS, why=(
                   "dQ and dK re-read by q's and k's bias gradients, a sum over the "
                   "tokens (loop_reduce_fusion, .1-.3) whose result the next kernels "
                   "(the global norm's, adam's) sum over the batch: one reduction "
                   "over dims {0,2} in two stages")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the state is returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("loop_reduce_fusion.8, .11: the QKV weight gradient's three slice "
                   "readers square and sum (the global norm): no elementwise epilogue",
                   kind=K.UNFUSED_EPILOGUE, shape=_QKV),
        NotFlagged("a reduce's first stage is not the statistic: the bias gradient also "
                   "sums the batch", kind=K.SEPARATE_REDUCTION,
                   shape=f"f32[{BATCH * HEADS},{SEQ},{D_MODEL // HEADS}]",
                   evidence="batch axis 0 kept"),
        NotFlagged("the embedding gradient is a scatter-add into a zero table (the "
                   "broadcast is the scatter's destination, updated in place): its sum "
                   "of squares needs every row's accumulated sum, so it cannot run in "
                   "the scatter", kind=K.SEPARATE_REDUCTION, marker="embed"),
        NotFlagged("XLA's Triton softmax is one kernel", says="pallas_kernels.softmax"),
        NotFlagged("XLA's Triton LayerNorm is one kernel: no statistics kernel to add",
                   says="pallas_kernels.layer_norm", op="layer_norm"),
        NotFlagged("no RMS norm here: haiku's LayerNorm centers", says="rms_norm"),
    ),
)

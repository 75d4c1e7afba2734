"""transformers FlaxBertForMaskedLM (a tiny config, bf16 compute) trained
the way transformers' examples/flax/language-modeling/run_mlm_flax.py
writes its step (label mask, one-hot cross-entropy, optax adamw), jitted
instead of pmapped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from flax.training.common_utils import onehot
from transformers import BertConfig, FlaxBertForMaskedLM

BATCH, SEQ, VOCAB, DIM, LAYERS, HEADS, FFN = 8, 32, 512, 64, 2, 4, 256

CONFIG = BertConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS,
                    num_attention_heads=HEADS, intermediate_size=FFN,
                    max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)


def train_step(state, batch, dropout_rng):
  dropout_rng, new_dropout_rng = jax.random.split(dropout_rng)

  def loss_fn(params):
    labels = batch.pop("labels")
    logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng,  # <apply>
                            train=True)[0]
    label_mask = jnp.where(labels > 0, 1.0, 0.0)  # <mask>
    loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask  # <loss>
    return loss.sum() / label_mask.sum()

  loss, grad = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  new_state = state.apply_gradients(grads=grad)  # <update>
  return new_state, loss, new_dropout_rng


def build():
  model = FlaxBertForMaskedLM(CONFIG, seed=0, dtype=jnp.bfloat16)
  state = train_state.TrainState.create(apply_fn=model.__call__, params=model.params,
                                        tx=optax.adamw(1e-4, weight_decay=0.01))
  ids = jnp.ones((BATCH, SEQ), jnp.int32)
  batch = {"input_ids": ids, "attention_mask": ids, "token_type_ids": jnp.zeros_like(ids),
           "labels": ids}
  return jax.jit(train_step), (state, batch, jax.random.key(1))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.12, transformers 4.57). Two BERT
# layers in bf16 with f32 LayerNorms: per layer, separate q/k/v/out
# projections whose weights and per-head activations are transposed for the
# backward dots, a softmax over [8,4,32,32] scores (max and sum re-read the
# scores), a gelu FFN, three LayerNorms over the last axis (64); the MLM head
# (dense, gelu, LayerNorm, decoder tied to the word embeddings) feeds a
# one-hot cross-entropy whose log-softmax re-reads the f32 logits. bf16
# values XLA writes and reads back widened (attention probabilities, the
# mask) are f32 -> bf16 -> f32 round trips: never bit-exact to remove.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

TRUTH = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, "bf16[8,32,512]", "loss", says="column_reduction", why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,32,256]", "apply", says="column_reduction", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,64]", "apply", says="layer_norm", count=6, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,64]", "apply", says="column_reduction", count=5, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,64]", "apply", says="column_reduction", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,4,32,32]", "apply", says="softmax", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,64]", "apply", says="norm_backward", count=6, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,32,64]", "apply", says="column_reduction", count=5, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,4,32,16]", "apply", says="column_reduction", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the TrainState is returned updated but not donated")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "the TrainState is returned updated but not donated")),
        Expect(K.STANDALONE_COPY, "bf16[512,64]", "apply", why=(
            "a bf16 conversion kernel of its own (attention probabilities, embeddings) whose readers widen it again: removing it drops the rounding")),
        Expect(K.STANDALONE_COPY, "bf16[8,4,32,32]", "apply", count=2, why=(
            "a bf16 conversion kernel of its own (attention probabilities, embeddings) whose readers widen it again: removing it drops the rounding")),
        Expect(K.STANDALONE_COPY, "bf16[256,1,64]", "apply", why=(
            "a bf16 conversion kernel of its own (attention probabilities, embeddings) whose readers widen it again: removing it drops the rounding")),
        Expect(K.STANDALONE_COPY, "bf16[8,4,16,32]", "apply", count=2, why=(
            "a bf16 conversion kernel of its own (attention probabilities, embeddings) whose readers widen it again: removing it drops the rounding")),
        Expect(K.STANDALONE_COPY, "bf16[8,4,32]", "apply", count=2, why=(
            "a bf16 conversion kernel of its own (attention probabilities, embeddings) whose readers widen it again: removing it drops the rounding")),
        Expect(K.LAYOUT_CONFLICT, "bf16[512,256]", "loss", why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "bf16[256,256]", "apply", count=2, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[8,4,16,32]", "apply", count=2, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "bf16[64,256]", "apply", count=11, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "bf16[256,64]", "apply", count=8, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "bf16[8,4,32,16]", "apply", count=6, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.LAYOUT_CONFLICT, "bf16[8,4,16,32]", "apply", count=4, why=(
            "a transpose (weights, per-head activations) materialized only for the dot that reads it")),
        Expect(K.EXPANDED_BROADCAST, "f32[8,32,64]", "apply", count=12, why=(
            "a LayerNorm's scale or rstd broadcast to [8,32,64] for its backward")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,512]", "apply", why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,256]", "apply", count=4, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[64,512]", "apply", why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,4,16,32]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,64]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[8,4,32,32]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[64,256]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,64]", "apply", count=4, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,64]", "apply", count=17, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[8,4,32,16]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[8,4,16,32]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[256,64]", "apply", count=2, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_EPILOGUE, "bf16[64,64]", "apply", count=9, why=(
            "a projection, attention or weight-gradient dot read back by bias, gelu, casts, transposes or adamw's moments")),
        Expect(K.UNFUSED_PROLOGUE, "f32[8,4,32,32]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[256,256]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[8,4,32,32]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[8,4,32,32]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[64,256]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[256,64]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[256,64]", "apply", count=2, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.UNFUSED_PROLOGUE, "bf16[64,64]", "apply", count=9, why=(
            "casts, scales and LayerNorm applies written only for the dots that read them")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,512]", "loss", count=4, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,32,512]", "apply", why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,32,64]", "apply", count=5, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "f32[8,4,32,32]", "apply", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,4,32,32]", "apply", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
        Expect(K.SEPARATE_REDUCTION, "bf16[8,4,32]", "apply", count=2, why=(
            "a buffer re-read by its own reduce: LayerNorm statistics, attention softmax, the MLM cross-entropy's log-softmax, bias and gamma gradients, LayerNorm backward terms")),
    ),
    not_flagged=(
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact to "
                   "remove", evidence="narrowing round trip", numerical="EXACT"),
        NotFlagged("a narrowing round trip is never safe to remove",
                   evidence="narrowing round trip", verdict="safe"),
        NotFlagged("BERT's norms are LayerNorms: no rms norm", says="rms_norm"),
        NotFlagged("no batch norm in a transformer", says="batch_norm_stats"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/bert_mlm.hlo.gz, jax
# 0.12, transformers 4.57). Per layer: q/k/v as one gemm whose result three
# kernels slice, bias and transpose per head; gemm -> XLA's Triton softmax
# (the mask added inside) -> gemm for attention, forward and backward; the
# LayerNorms' statistics computed in f32 by one kernel re-reading the
# residual and the projection's result, their applies fused with the cast to
# bf16 (and written only for gemms where no residual reads them). The MLM
# loss is two Triton kernels re-reading the decoder's logits. bf16 weight
# casts are kernels of their own read by two gemms each.
_B = f"bf16[{BATCH * SEQ},{DIM}]"
_BT = f"bf16[{BATCH},{SEQ},{DIM}]"
_FT = f"f32[{BATCH},{SEQ},{DIM}]"
_HEADS_B = f"bf16[{BATCH * HEADS},{SEQ},{SEQ}]"

TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, _HEADS_B, "apply", says="dot_product_attention",
               count=4, why=(
                   "per layer, scores -> Triton softmax -> PV gemm forward and dP -> "
                   "softmax backward -> dQ/dK gemms: only a fused attention kernel "
                   "keeps them on chip")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH * SEQ},{VOCAB}]", "apply",
               says="log_softmax", why=(
                   "the decoder's logits re-read by the loss kernel and the "
                   "gradient kernel, each computing the log-softmax's max and sum")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH},{SEQ},{VOCAB}]", "loss",
               says="column_reduction", why=(
                   "dlogits re-read by the decoder bias's gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _B, "apply", says="layer_norm", count=3, why=(
            "the attention output projections' and the MLM transform's results "
            "re-read by the next LayerNorm's statistics")),
        Expect(K.SEPARATE_REDUCTION, _B, "apply", says="norm_backward", count=6, why=(
            "the q, k and v input-gradient gemms' results, each re-read only by "
            "the LayerNorm backward kernel that sums them")),
        Expect(K.SEPARATE_REDUCTION, _B, "apply", says="column_reduction", why=(
            "the encoder's output gradient re-read by the output LayerNorm's beta "
            "gradient and backward sums")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH},{SEQ},{FFN}]", "apply",
               says="column_reduction", count=2, why=(
                   "gelu-backward dz re-read by the intermediate dense's bias-"
                   "gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _FT, "apply", says="column_reduction", count=6, why=(
            "each LayerNorm's dgamma term, written beside its backward row sums, "
            "re-read by its reduce over the tokens")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH * SEQ},{DIM}]", "apply",
               says="column_reduction", why=(
                   "the MLM transform's dy (a split-K sum) written by its LayerNorm "
                   "backward row-sum kernel, re-read by the beta-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, _BT, "apply", says="column_reduction", count=9, why=(
            "LayerNorm dy written by the row-sum kernels and re-read by the beta "
            "gradients; LayerNorm dx re-read by the bias gradient of the dense "
            "before it")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH * HEADS},{SEQ},{DIM // HEADS}]", "apply",
               says="dims {", count=4, why=(
                   "dQ and dK of each layer re-read by their bias-gradient reduces")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH * HEADS},{DIM // HEADS},{SEQ}]", "apply",
               says="dims {0,3}", count=2, why="dV re-read by the value bias-gradient reduce"),
        Expect(K.LAYOUT_CONFLICT, None, "apply", says="transpose", count=8, why=(
            "per-head activations and gradients transposed only for the dot that "
            "reads them")),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH * SEQ},{3 * DIM}]", "apply", says="split:3",
               count=2, why=("the fused q/k/v projection read through three column "
                             "slices (bias, transpose per head)")),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH * SEQ},{FFN}]", "apply", says="gelu",
               count=2, why="the intermediate dense read back by bias + gelu and the gelu backward"),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH * SEQ},{FFN}]", "apply",
               bytes=2 * BATCH * SEQ * FFN * 2, count=2,
               why="the output dense's input gradient read once by the gelu backward"),
        Expect(K.UNFUSED_EPILOGUE, _B, "apply", says="outputs:2", count=2, why=(
            "the attention output's input gradient read by two transposes (for "
            "dP and dV)")),
        Expect(K.UNFUSED_PROLOGUE, None, "apply", says="cast", count=13, why=(
            "the bf16 casts of the dense kernels, read only by their forward and "
            "input-gradient gemms")),
        Expect(K.UNFUSED_PROLOGUE, _BT, "apply", says="affine", count=4, why=(
            "LayerNorm applies cast to bf16 and written only for the next dense "
            "and its weight-gradient gemm")),
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{BATCH},{SEQ},{HEADS},{DIM // HEADS}]", "apply",
               says="scale", count=2, why=(
                   "dQ scaled by 1/sqrt(d) and transposed only for the input- and "
                   "weight-gradient gemms")),
        Expect(K.STANDALONE_COPY, f"bf16[{VOCAB},{DIM}]", "apply", says="dtype conversion",
               why=("the word embeddings cast to bf16 for the embedding gather and "
                    "the tied decoder's gemms")),
        Expect(K.REMAT_CANDIDATE, _BT, "apply", why=(
            "the first layer's output LayerNorm apply, held from the forward pass "
            "across the peak to the backward while its inputs stay live anyway")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "the TrainState and the dropout key are returned updated but not "
            "donated")),
    ),
    not_flagged=(
        NotFlagged("XLA's Triton softmax is one kernel", says="pallas_kernels.softmax"),
        NotFlagged("a LayerNorm's variance clamp is no relu", says="activation:relu"),
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact to "
                   "remove", evidence="narrowing round trip", numerical="EXACT"),
        NotFlagged("BERT's norms are LayerNorms: no rms norm", says="rms_norm"),
        NotFlagged("no batch norm in a transformer", says="batch_norm_stats"),
    ),
)

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

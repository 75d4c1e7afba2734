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

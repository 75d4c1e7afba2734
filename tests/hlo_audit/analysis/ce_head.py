"""A language model's output head as optax's users write it: a bf16
projection to a 32k vocabulary, the integer-label cross-entropy in f32 and
an AdamW step (the shapes where the logits' traffic dominates the step)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

TOKENS, D_MODEL, VOCAB = 256, 128, 32768
tx = optax.adamw(1e-3)


def step(params, opt_state, x, labels):
  def loss_fn(p):
    logits = x.astype(jnp.bfloat16) @ p["w"]  # <logits>
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels).mean()  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def build():
  """(jitted step, abstract arguments)."""
  params = {"w": jax.ShapeDtypeStruct((D_MODEL, VOCAB), jnp.bfloat16)}
  opt_state = jax.eval_shape(tx.init, params)
  return jax.jit(step), (params, opt_state,
                         jax.ShapeDtypeStruct((TOKENS, D_MODEL), jnp.float32),
                         jax.ShapeDtypeStruct((TOKENS,), jnp.int32))


if __name__ == "__main__":  # rewrites the committed H200 compile
  import gzip
  import pathlib

  import hlo_audit

  fn, args = build()
  text = hlo_audit.capture(fn, *args, target="h200").hlo_text
  out = pathlib.Path(__file__).parent / "time_fixtures" / "ce_head_h200.hlo.gz"
  out.write_bytes(gzip.compress(text.encode(), mtime=0))
  print(f"wrote {out}")

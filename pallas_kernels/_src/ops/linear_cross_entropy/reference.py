"""Plain-jnp linear cross-entropy: the specification and the XLA fallback.

Semantics (the kernels must match these):

* logits = x @ w (+ bias), accumulated in float32 from the input dtypes
  (`preferred_element_type=float32`), x and w first rounded to
  `compute_dtype` where one is given; everything after is float32.
* loss_i = logsumexp(logits_i) - logits_i[labels_i]. A label outside
  [0, V) that is not `ignore_index` gives a NaN loss (and no gradient).
* A token whose label equals `ignore_index` has loss 0 and gradient 0.
* reduction "none": the losses, shaped like labels; "sum": their sum;
  "mean": the sum over the tokens not ignored (NaN when all are ignored).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

REDUCTIONS = ("none", "sum", "mean")


def ignored(labels, ignore_index: int | None):
  """Boolean mask of the tokens whose loss is ignored (None: none are)."""
  if ignore_index is None:
    return jnp.zeros(labels.shape, jnp.bool_)
  return labels == ignore_index


def reduce(losses, labels, *, reduction: str, ignore_index: int | None):
  """Reduces float32 per-token `losses` (ignored ones already 0)."""
  if reduction == "none":
    return losses
  total = jnp.sum(losses)
  if reduction == "sum":
    return total
  count = jnp.sum(~ignored(labels, ignore_index), dtype=jnp.float32)
  return total / count


def _token_losses(x, w, labels, bias, ignore_index, precision):
  logits = jnp.dot(x, w, preferred_element_type=jnp.float32, precision=precision)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  vocab = w.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)
  index = jnp.clip(labels, 0, vocab - 1).astype(jnp.int32)[..., None]
  picked = jnp.take_along_axis(logits, index, axis=-1)[..., 0]
  in_range = (labels >= 0) & (labels < vocab)
  loss = jnp.where(in_range, lse - picked, jnp.nan)
  return jnp.where(ignored(labels, ignore_index), 0.0, loss)


def linear_cross_entropy(x, w, labels, *, bias=None, reduction: str = "mean",
                         ignore_index: int | None = None, precision=None,
                         compute_dtype=None) -> jax.Array:
  """Cross-entropy of softmax(x @ w + bias) against labels (XLA fallback)."""
  if compute_dtype is not None:
    x, w = x.astype(compute_dtype), w.astype(compute_dtype)
  losses = _token_losses(x, w, labels, bias, ignore_index, precision)
  return reduce(losses, labels, reduction=reduction, ignore_index=ignore_index)


def linear_cross_entropy_f32(x, w, labels, *, bias=None, reduction: str = "mean",
                             ignore_index: int | None = None,
                             compute_dtype=None) -> jax.Array:
  """Ground truth for validation: float32 inputs at Precision.HIGHEST (x and
  w first rounded to `compute_dtype`, as the op rounds them)."""
  f32 = jnp.float32
  if compute_dtype is not None:
    x, w = x.astype(compute_dtype), w.astype(compute_dtype)
  return linear_cross_entropy(
      x.astype(f32), w.astype(f32), labels,
      bias=None if bias is None else bias.astype(f32), reduction=reduction,
      ignore_index=ignore_index, precision=jax.lax.Precision.HIGHEST)

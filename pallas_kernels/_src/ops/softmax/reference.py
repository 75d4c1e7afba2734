"""Plain-jnp softmax: the specification and the XLA fallback.

Semantics (the kernel must match these):

* Softmax over the last axis, in float32: `logits = x * scale` (when `scale` is
  given), then `+ mask` for a floating (additive) mask, which may be any shape
  that broadcasts to x, e.g. [q, k] for x [batch, heads, q, k].
* A boolean mask (True = keep) and `causal=True` remove entries (their
  probability is exactly 0). Causal masking is over the last two axes, query
  `i` (axis -2) keeps key `j` (axis -1) when `j <= i + offset`:
  `causal_alignment="top_left"` (default, offset 0) matches
  `jax.nn.dot_product_attention(is_causal=True)`; `"bottom_right"` (offset
  `k - q`) aligns the last query with the last key, as for queries appended to
  a KV cache. With `q == k` both are the usual lower triangle.
* A fully masked row (every logit removed or -inf) is all zeros, as
  `jax.nn.softmax(x, where=mask)` gives; plain `jax.nn.softmax` would give NaN
  for an all -inf row.
* NaN or +Inf among a row's kept logits makes the whole row NaN, as in XLA
  (`exp(inf - inf)`); -Inf logits just get probability 0.
* The result is cast to `out_dtype` (default x.dtype).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ALIGNMENTS = ("top_left", "bottom_right")


def causal_offset(q_len: int, k_len: int, alignment: str) -> int:
  """Offset of the causal diagonal: key j is kept for query i iff j <= i + offset."""
  return 0 if alignment == "top_left" else k_len - q_len


def _softmax(x, scale, mask, causal, causal_alignment, out_dtype, final_cast):
  s = x.astype(jnp.float32)
  if scale is not None:
    s = s * jnp.float32(scale)
  keep = None
  if mask is not None:
    if mask.dtype == jnp.bool_:
      keep = jnp.broadcast_to(mask, x.shape)
    else:
      s = s + mask.astype(jnp.float32)
  if causal:
    q_len, k_len = x.shape[-2], x.shape[-1]
    offset = causal_offset(q_len, k_len, causal_alignment)
    tri = (jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None] + offset)
    keep = tri if keep is None else keep & tri
  if keep is not None:
    s = jnp.where(keep, s, -jnp.inf)
  row_max = jnp.max(s, axis=-1, keepdims=True)
  # A fully masked row has max -inf: shift by 0 so exp gives zeros, not NaN.
  row_max = jnp.where(row_max == -jnp.inf, 0.0, row_max)
  e = jnp.exp(s - row_max)
  denom = jnp.sum(e, axis=-1, keepdims=True)
  y = e / jnp.where(denom == 0, 1.0, denom)
  if not final_cast:
    return y
  return y.astype(x.dtype if out_dtype is None else out_dtype)


def softmax(x, *, scale: float | None = None, mask=None, causal: bool = False,
            causal_alignment: str = "top_left", out_dtype=None) -> jax.Array:
  """Softmax with the semantics of the module docstring (XLA fallback)."""
  return _softmax(x, scale, mask, causal, causal_alignment, out_dtype, True)


def softmax_f32(x, *, scale: float | None = None, mask=None, causal: bool = False,
                causal_alignment: str = "top_left", out_dtype=None) -> jax.Array:
  """Ground truth for validation: `softmax` without the final cast (float32).

  No matmul is involved, so there is no `precision` to raise.
  """
  del out_dtype
  return _softmax(x, scale, mask, causal, causal_alignment, None, False)

"""Public softmax with fused scale, additive/boolean/causal masking and cast."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Literal

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.softmax import config as config_lib
from pallas_kernels._src.ops.softmax import guard
from pallas_kernels._src.ops.softmax import kernel
from pallas_kernels._src.ops.softmax import reference
from pallas_kernels._src.ops.softmax import tpu as softmax_tpu
from pallas_kernels._src.ops.softmax import vjp

Implementation = Literal["pallas", "xla"]
_IMPLEMENTATIONS = (None, "pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"softmax: {message}")


def _check(x, scale, mask, causal, causal_alignment, out_dtype, implementation,
           config, backward_config) -> None:
  if x.ndim < 1:
    _fail(f"x must have at least one axis, got shape {x.shape}")
  if x.shape[-1] == 0:
    _fail(f"softmax over an empty last axis: x.shape {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    _fail(f"x must be floating point, got {x.dtype} with shape {x.shape}")
  if scale is not None:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
      # A traced scale cannot reach the kernel body, which bakes it in.
      _fail(f"scale must be a Python float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
      _fail(f"scale must be finite, got {scale}")
  if mask is not None:
    if mask.dtype != jnp.bool_ and not jnp.issubdtype(mask.dtype, jnp.floating):
      _fail(f"mask must be boolean (True = keep) or floating (additive), got "
            f"{mask.dtype} with shape {mask.shape}")
    if mask.ndim > x.ndim:
      _fail(f"mask.shape {mask.shape} has more axes than x.shape {x.shape}")
    padded = (1,) * (x.ndim - mask.ndim) + tuple(mask.shape)
    if any(m not in (1, d) for m, d in zip(padded, x.shape)):
      _fail(f"mask.shape {tuple(mask.shape)} does not broadcast to x.shape "
            f"{tuple(x.shape)}")
  if not isinstance(causal, bool):
    _fail(f"causal must be a bool, got {type(causal).__name__}")
  if causal and x.ndim < 2:
    _fail(f"causal masking needs x with a query axis, got shape {x.shape}")
  if causal_alignment not in reference.ALIGNMENTS:
    _fail(f"causal_alignment must be one of {reference.ALIGNMENTS}, got "
          f"{causal_alignment!r}")
  if out_dtype is not None and not jnp.issubdtype(jnp.dtype(out_dtype), jnp.floating):
    _fail(f"out_dtype must be a floating dtype, got {jnp.dtype(out_dtype)}")
  if implementation not in _IMPLEMENTATIONS:
    _fail(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
  for name, c in (("config", config), ("backward_config", backward_config)):
    if c is not None and not isinstance(c, config_lib.Config):
      _fail(f"{name} must be a softmax Config, got {type(c).__name__}")


@functools.partial(jax.jit, static_argnames=("scale", "causal", "causal_alignment",
                                             "out_dtype"))
def _reference(x, mask, *, scale, causal, causal_alignment, out_dtype):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.softmax(x, scale=scale, mask=mask, causal=causal,
                           causal_alignment=causal_alignment, out_dtype=out_dtype)


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnums=(2,))
def _run(x, mask, static: vjp.Static):
  return vjp.softmax(x, mask, static)


def softmax(x, *, scale: float | None = None, mask=None, causal: bool = False,
            causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
            out_dtype=None, implementation: Implementation | None = None,
            interpret: bool | None = None, config: config_lib.Config | None = None,
            backward_config: config_lib.Config | None = None) -> jax.Array:
  """Softmax over the last axis with fused scale, masks and output cast.

  Computes `softmax(x * scale + mask)` in float32 with masked entries removed;
  see `softmax/reference.py` for the exact semantics, which every
  implementation follows.

  Args:
    x: [..., k] logits, e.g. [batch, heads, q, k] attention scores.
    scale: multiplies the logits before masking (a Python float; static).
    mask: broadcastable to x. Boolean: True keeps an entry, False removes it
      (probability 0). Floating: added to the scaled logits (its gradient is
      summed over the broadcast axes). Never materialized at x's shape.
    causal: remove keys after the query over the last two axes.
    causal_alignment: "top_left" (key j kept for query i iff j <= i, like
      `jax.nn.dot_product_attention`) or "bottom_right" (j <= i + k - q, the
      last query sees every key). Same for square inputs.
    out_dtype: dtype of the result (default x.dtype).
    implementation: "pallas" runs the kernel (interpreted where it cannot be
      compiled); "xla" runs the reference; None runs the kernel on GPU and XLA
      elsewhere unless `interpret=True` asks for the interpreted kernel.
      Arguments the guard rejects run the reference, recorded in
      `pallas_kernels.fallbacks()`.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: forward tiling; None uses `config.heuristic_config`.
    backward_config: backward tiling; None uses the heuristic.

  Returns:
    Probabilities shaped like x. A row whose entries are all removed (or all
    -inf) is all zeros; NaN or +Inf among a row's kept logits gives a NaN row.

  Raises:
    ValueError: for bad arguments; the message names the offending shape.
  """
  x = jnp.asarray(x)
  mask = None if mask is None else jnp.asarray(mask)
  _check(x, scale, mask, causal, causal_alignment, out_dtype, implementation,
         config, backward_config)
  out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)
  scale = None if scale is None else float(scale)

  def run_reference():
    return _reference(x, mask, scale=scale, causal=causal,
                      causal_alignment=causal_alignment, out_dtype=out_dtype)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    return _launch(x, mask, scale=scale, causal=causal, causal_alignment=causal_alignment,
                   out_dtype=out_dtype, interp=interp, config=config,
                   backward_config=backward_config, run_reference=run_reference)

  return backend_lib.dispatch(interpret, (x, mask), launch)


def _launch(x, mask, *, scale, causal, causal_alignment, out_dtype, interp: bool,
            config, backward_config, run_reference):
  """The guarded kernel call for the current target and interpret mode."""
  shape = tuple(x.shape)
  on_tpu = tpu_lib.is_target()
  if on_tpu:
    layout = softmax_tpu.Layout.of(
        shape, None if mask is None else tuple(mask.shape),
        None if mask is None else ("boolean" if mask.dtype == jnp.bool_ else "additive"),
        reference.causal_offset(shape[-2], shape[-1], causal_alignment) if causal else None)
    reason = guard.tpu_unsupported_reason(
        x_shape=shape, x_dtype=x.dtype, mask_dtype=None if mask is None else mask.dtype,
        out_dtype=out_dtype, layout=layout,
        requested_rows=None if config is None else config.block_rows)
  else:
    reason = guard.unsupported_reason(
        x_shape=shape, x_dtype=x.dtype,
        mask_dtype=None if mask is None else mask.dtype, interpret=interp)
  if reason:
    guard_lib.record_fallback("softmax", reason, guard_lib.signature(x=x, mask=mask))
    return run_reference()

  masking = kernel.Masking(
      mask_kind=None if mask is None else (
          "boolean" if mask.dtype == jnp.bool_ else "additive"),
      layout=None if mask is None else kernel.MaskLayout.of(shape, tuple(mask.shape)),
      causal=causal,
      q_len=shape[-2] if causal else 1,
      offset=reference.causal_offset(shape[-2], shape[-1], causal_alignment)
      if causal else 0)
  tiling_backend = backend_lib.Backend.CPU if interp else backend_lib.current_backend()
  tpu_plan = None
  if on_tpu:
    tpu_plan = _tpu_plan(x, mask, layout, out_dtype, config, backward_config)
    guard_lib.record_choice("softmax", tpu_lib.KERNEL_BACKEND, "",
                            guard_lib.signature(x=x, mask=mask))
  static = vjp.Static(
      scale=scale, causal=causal, causal_alignment=causal_alignment,
      masking=masking, out_dtype=jnp.dtype(out_dtype).name,
      cfg=config or config_lib.heuristic_config(shape, x.dtype, tiling_backend),
      bwd_cfg=backward_config or config_lib.heuristic_backward_config(
          shape, x.dtype, tiling_backend),
      interpret=interp, tpu=tpu_plan)
  return _run(x, mask, static)


def _tpu_plan(x, mask, layout, out_dtype, config, backward_config) -> vjp.TpuPlan:
  """Row blocks of the TPU kernels (the forward's fits: the guard said so)."""
  mask_dtype = None
  if mask is not None:
    mask_dtype = jnp.int8 if mask.dtype == jnp.bool_ else mask.dtype
  bm, _ = softmax_tpu.forward_block_rows(
      layout, x_dtype=x.dtype, mask_dtype=mask_dtype, out_dtype=out_dtype,
      requested=None if config is None else config.block_rows)
  bwd_bm, fit = softmax_tpu.backward_block_rows(
      x.size // x.shape[-1], x.shape[-1], y_dtype=out_dtype, dy_dtype=out_dtype,
      dx_dtype=x.dtype,
      requested=None if backward_config is None else backward_config.block_rows)
  return vjp.TpuPlan(layout=layout, block_rows=bm, bwd_block_rows=bwd_bm, bwd_reason=fit)

"""custom_vjp wiring of the normalization kernels.

The forward kernel saves float32 per-row mean/rstd; the backward kernel uses
them with h (x, or x + residual as returned) to produce dx, and dgamma/dbeta
from per-program partial sums. The residual's gradient is dx itself: h = x + r
sends the same cotangent to both inputs (cast to each one's dtype), and the
cotangent of the returned h is added in the kernel.

When the backward kernel cannot run (see `guard.backward_unsupported_reason`)
the forward saves its inputs instead and the backward is `jax.vjp` of the
reference, recorded as a fallback when the backward is traced. Quantized
outputs are not differentiable: differentiating them raises a TypeError.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.normalization import guard
from pallas_kernels._src.ops.normalization import kernel
from pallas_kernels._src.ops.normalization import reference
from pallas_kernels._src.ops.normalization import tpu as norm_tpu
from pallas_kernels._src.ops.normalization.config import Config


@dataclasses.dataclass(frozen=True, slots=True)
class TpuPlan:
  """The Mosaic TPU kernels' tiling of a call (built for a TPU target)."""

  #: Rows per block of the forward and the backward kernel.
  block_rows: int
  bwd_block_rows: int
  #: Why the backward kernel cannot run (then XLA's vjp runs), or None.
  bwd_reason: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable for custom_vjp)."""

  kind: str
  eps: float
  out_dtype: str
  quantize: str | None
  cfg: Config
  bwd_cfg: Config
  interpret: bool
  x_dtype: str
  residual_dtype: str | None
  beta_dtype: str | None
  #: Set: the TPU kernels (`tpu.py`) run the call, not the Triton ones.
  tpu: TpuPlan | None = None


def reference_outputs(static: Static, x, residual, gamma, beta):
  """The reference, shaped like `norm`'s (y, h, scale) triple."""
  if static.kind == "layer_norm":
    out = reference.layer_norm(x, gamma, beta, residual=residual, eps=static.eps,
                               out_dtype=static.out_dtype, quantize=static.quantize)
  else:
    out = reference.rms_norm(x, gamma, residual=residual, eps=static.eps,
                             out_dtype=static.out_dtype, quantize=static.quantize)
  normalized, h = out if residual is not None else (out, None)
  if static.quantize:
    values, scale = normalized
    return values, h, scale[..., 0]
  return normalized, h, None


def _forward(static: Static, x, residual, gamma, beta, save_stats: bool):
  if static.tpu is not None:
    return norm_tpu.forward(
        x, residual, gamma, beta, kind=static.kind, eps=static.eps,
        out_dtype=static.out_dtype, save_stats=save_stats,
        block_rows=static.tpu.block_rows, interpret=static.interpret)
  return kernel.forward(
      x, residual, gamma, beta, kind=static.kind, eps=static.eps,
      out_dtype=static.out_dtype, quantize=static.quantize,
      save_stats=save_stats, cfg=static.cfg, interpret=static.interpret)


def _backward_reason(static: Static, x) -> str | None:
  if static.tpu is not None:
    return static.tpu.bwd_reason
  return guard.backward_unsupported_reason(
      n_rows=x.shape[0], n_cols=x.shape[1], cfg=static.bwd_cfg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def norm(x, residual, gamma, beta, static: Static):
  """(y, h, scale) of 2-D `x` through the Pallas kernels; h/scale may be None."""
  out = _forward(static, x, residual, gamma, beta, save_stats=False)
  return out.y, out.h, out.scale


def _norm_fwd(x, residual, gamma, beta, static: Static):
  if static.quantize or _backward_reason(static, x):
    out = _forward(static, x, residual, gamma, beta, save_stats=False)
    # Keep the inputs: the backward will be the reference's (or an error).
    return (out.y, out.h, out.scale), (x, residual, gamma, beta)
  out = _forward(static, x, residual, gamma, beta, save_stats=True)
  h = x if residual is None else out.h
  return (out.y, out.h, out.scale), (h, gamma, out.mean, out.rstd)


def _norm_bwd(static: Static, saved, cts):
  if static.quantize:
    raise TypeError(
        f"{static.kind} with quantize={static.quantize!r} is not differentiable; "
        "differentiate the unquantized op instead")
  ct_y, ct_h, _ = cts
  x_like = saved[0]
  reason = _backward_reason(static, x_like)
  if reason:
    x, residual, gamma, beta = saved
    guard_lib.record_fallback(
        static.kind, "backward: " + reason,
        guard_lib.signature(x=x, residual=residual, gamma=gamma, beta=beta))
    _, pullback = jax.vjp(functools.partial(reference_outputs, static),
                          x, residual, gamma, beta)
    return pullback((ct_y, ct_h, None))
  h, gamma, mean, rstd = saved
  if static.tpu is not None:
    dh, dgamma, dbeta = norm_tpu.backward(
        h, gamma, mean, rstd, ct_y, ct_h, kind=static.kind, dx_dtype=h.dtype,
        block_rows=static.tpu.bwd_block_rows, interpret=static.interpret)
  else:
    dh, dgamma, dbeta = kernel.backward(
        h, gamma, mean, rstd, ct_y, ct_h, kind=static.kind, dx_dtype=h.dtype,
        cfg=static.bwd_cfg, interpret=static.interpret)
  dx = dh.astype(static.x_dtype)
  dres = None if static.residual_dtype is None else dh.astype(static.residual_dtype)
  dbeta = None if static.beta_dtype is None else dbeta.astype(static.beta_dtype)
  return dx, dres, dgamma.astype(gamma.dtype), dbeta


norm.defvjp(_norm_fwd, _norm_bwd)


def dtype_name(dt) -> str | None:
  """Name of a dtype, None for None (Static holds names: hashable and short)."""
  return None if dt is None else jnp.dtype(dt).name

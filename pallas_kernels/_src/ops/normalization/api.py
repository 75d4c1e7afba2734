"""Public layer norm and RMS norm with a fused residual prologue and cast or
quantize epilogue."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Literal

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops.normalization import config as config_lib
from pallas_kernels._src.ops.normalization import guard
from pallas_kernels._src.ops.normalization import reference
from pallas_kernels._src.ops.normalization import tpu as norm_tpu
from pallas_kernels._src.ops.normalization import vjp

Implementation = Literal["pallas", "xla"]
_IMPLEMENTATIONS = (None, "pallas", "xla")


def _fail(op: str, message: str) -> None:
  raise ValueError(f"{op}: {message}")


def _check(op: str, x, gamma, beta, residual, eps, out_dtype, quantize,
           implementation, config, backward_config) -> None:
  if x.ndim < 1:
    _fail(op, f"x must have at least one axis, got shape {x.shape}")
  n = x.shape[-1]
  if n == 0:
    _fail(op, f"cannot normalize over an empty last axis: x.shape {x.shape}")
  for name, a in (("x", x), ("gamma", gamma), ("beta", beta), ("residual", residual)):
    if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
      _fail(op, f"{name} must be floating point, got {a.dtype} with shape {a.shape}")
  for name, a in (("gamma", gamma), ("beta", beta)):
    if a is not None and tuple(a.shape) != (n,):
      _fail(op, f"{name}.shape {tuple(a.shape)} must be (x.shape[-1],) = ({n},) "
                f"for x of shape {tuple(x.shape)}")
  if residual is not None and tuple(residual.shape) != tuple(x.shape):
    _fail(op, f"residual.shape {tuple(residual.shape)} must equal x.shape "
              f"{tuple(x.shape)}")
  if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
    # A traced eps cannot reach the kernel body, which bakes it in.
    _fail(op, f"eps must be a Python float, got {type(eps).__name__}")
  if not (math.isfinite(eps) and eps >= 0):
    _fail(op, f"eps must be finite and >= 0, got {eps}")
  if quantize is not None and quantize not in quant.KINDS:
    _fail(op, f"quantize must be None or one of {quant.KINDS}, got {quantize!r}")
  if quantize is not None and out_dtype is not None:
    _fail(op, "out_dtype and quantize are exclusive epilogues")
  if out_dtype is not None and not jnp.issubdtype(jnp.dtype(out_dtype), jnp.floating):
    _fail(op, f"out_dtype must be a floating dtype, got {jnp.dtype(out_dtype)}")
  if implementation not in _IMPLEMENTATIONS:
    _fail(op, f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
  for name, c in (("config", config), ("backward_config", backward_config)):
    if c is not None and not isinstance(c, config_lib.Config):
      _fail(op, f"{name} must be a normalization Config, got {type(c).__name__}")
  if (backward_config is not None and backward_config.row_steps != 1
      and n > backward_config.block_cols):
    _fail(op, f"backward_config.row_steps must be 1 when x.shape[-1] ({n}) > "
              f"block_cols ({backward_config.block_cols})")


@functools.partial(jax.jit, static_argnames=("kind", "eps", "out_dtype", "quantize"))
def _reference(x, gamma, beta, residual, *, kind, eps, out_dtype, quantize):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  if kind == "layer_norm":
    return reference.layer_norm(x, gamma, beta, residual=residual, eps=eps,
                                out_dtype=out_dtype, quantize=quantize)
  return reference.rms_norm(x, gamma, residual=residual, eps=eps,
                            out_dtype=out_dtype, quantize=quantize)


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnums=(4,))
def _run(x2, r2, gamma, beta, static: vjp.Static):
  return vjp.norm(x2, r2, gamma, beta, static)


def _normalize(kind: str, x, gamma, beta, *, residual, eps, out_dtype, quantize,
               implementation, interpret, config, backward_config) -> Any:
  x = jnp.asarray(x)
  gamma = jnp.asarray(gamma)
  beta = None if beta is None else jnp.asarray(beta)
  residual = None if residual is None else jnp.asarray(residual)
  _check(kind, x, gamma, beta, residual, eps, out_dtype, quantize,
         implementation, config, backward_config)

  def run_reference():
    return _reference(x, gamma, beta, residual, kind=kind, eps=float(eps),
                      out_dtype=None if out_dtype is None else jnp.dtype(out_dtype),
                      quantize=quantize)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    return _launch(kind, x, gamma, beta, residual, eps=eps, out_dtype=out_dtype,
                   quantize=quantize, interp=interp, config=config,
                   backward_config=backward_config, run_reference=run_reference)

  return backend_lib.dispatch(interpret, (x, residual, gamma, beta), launch)


def _launch(kind, x, gamma, beta, residual, *, eps, out_dtype, quantize,
            interp: bool, config, backward_config, run_reference):
  """The guarded kernel call for the current target and interpret mode."""
  dtypes = tuple(a.dtype for a in (x, gamma, beta, residual) if a is not None)
  h_dtype = reference.h_dtype(x.dtype, None if residual is None else residual.dtype)
  y_dtype = jnp.dtype(out_dtype if out_dtype is not None else h_dtype)
  on_tpu = tpu_lib.is_target()
  signature = guard_lib.signature(x=x, residual=residual, gamma=gamma, beta=beta)
  if on_tpu:
    reason = guard.tpu_unsupported_reason(
        x_shape=tuple(x.shape), dtypes=dtypes,
        residual_dtype=None if residual is None else residual.dtype, out_dtype=y_dtype,
        quantize=quantize, requested_rows=None if config is None else config.block_rows)
  else:
    reason = guard.unsupported_reason(x_shape=tuple(x.shape), dtypes=dtypes,
                                      quantize=quantize, interpret=interp)
  if reason:
    guard_lib.record_fallback(kind, reason, signature)
    return run_reference()

  # Interpret mode gets the interpreter's tiling wherever it runs.
  tiling_backend = backend_lib.Backend.CPU if interp else backend_lib.current_backend()
  cfg = config or config_lib.heuristic_config(tuple(x.shape), x.dtype, tiling_backend)
  bwd_cfg = backward_config or config_lib.heuristic_backward_config(
      tuple(x.shape), x.dtype, tiling_backend)
  tpu_plan = None
  if on_tpu:
    tpu_plan = _tpu_plan(x, residual, y_dtype, config, backward_config)
    guard_lib.record_choice(kind, tpu_lib.KERNEL_BACKEND, "", signature)
  static = vjp.Static(
      kind=kind, eps=float(eps),
      out_dtype=vjp.dtype_name(y_dtype),
      quantize=quantize, cfg=cfg, bwd_cfg=bwd_cfg, interpret=interp,
      x_dtype=vjp.dtype_name(x.dtype),
      residual_dtype=vjp.dtype_name(None if residual is None else residual.dtype),
      beta_dtype=vjp.dtype_name(None if beta is None else beta.dtype), tpu=tpu_plan)

  lead, n = tuple(x.shape[:-1]), x.shape[-1]
  y, h, scale = _run(x.reshape(-1, n),
                     None if residual is None else residual.reshape(-1, n),
                     gamma, beta, static)
  normalized = y.reshape(x.shape)
  if quantize:
    normalized = (normalized, scale.reshape(lead + (1,)))
  if residual is None:
    return normalized
  return normalized, h.reshape(x.shape)


def _tpu_plan(x, residual, y_dtype, config, backward_config) -> vjp.TpuPlan:
  """Row blocks of the TPU kernels (the forward's fits: the guard said so)."""
  n_rows, n_cols = guard.rows_and_cols(tuple(x.shape))
  rdt = None if residual is None else residual.dtype
  bm, _ = norm_tpu.forward_block_rows(
      n_rows, n_cols, x_dtype=x.dtype, residual_dtype=rdt, out_dtype=y_dtype,
      requested=None if config is None else config.block_rows)
  bwd_bm, fit = norm_tpu.backward_block_rows(
      n_rows, n_cols, h_dtype=reference.h_dtype(x.dtype, rdt), dy_dtype=y_dtype,
      has_dh=residual is not None,
      requested=None if backward_config is None else backward_config.block_rows)
  return vjp.TpuPlan(block_rows=bm, bwd_block_rows=bwd_bm,
                     bwd_reason=guard.tpu_backward_unsupported_reason(
                         n_rows=n_rows, n_cols=n_cols, block_rows=bwd_bm,
                         fit_reason=fit))


def layer_norm(x, gamma, beta, *, residual=None, eps: float = 1e-6,
               out_dtype=None, quantize: str | None = None,
               implementation: Implementation | None = None,
               interpret: bool | None = None,
               config: config_lib.Config | None = None,
               backward_config: config_lib.Config | None = None) -> Any:
  """Layer norm over the last axis with optional fused residual add.

  `y = (h - mean(h)) / sqrt(var(h) + eps) * gamma + beta` with float32
  statistics, where `h = x + residual` (rounded to the promoted input dtype and
  returned too) or `h = x`. See `normalization/reference.py` for the exact
  semantics, which every implementation follows.

  Args:
    x: [..., n] floating input; leading dims are independent rows.
    gamma: [n] scale.
    beta: [n] shift.
    residual: optional [..., n] (same shape as x) added before normalizing.
    eps: added to the variance (a Python float >= 0; static).
    out_dtype: dtype of the normalized output (default: dtype of h).
    quantize: None, "int8" or "float8_e4m3fn": return `(values, scales)` with
      per-row float32 `scales` of shape [..., 1] (values * scales ~= y).
      Exclusive with `out_dtype`; not differentiable.
    implementation: "pallas" runs the kernel (interpreted where it cannot be
      compiled); "xla" runs the reference; None runs the kernel on GPU and XLA
      elsewhere unless `interpret=True` asks for the interpreted kernel. Where
      the guard rejects the arguments the reference runs and the reason is
      recorded (see `pallas_kernels.fallbacks()`).
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: forward tiling; None uses `config.heuristic_config`.
    backward_config: backward tiling; None uses the heuristic.

  Returns:
    `normalized` without residual, `(normalized, h)` with it; `normalized` is
    an array, or a `(values, scales)` pair when quantizing.

  Raises:
    ValueError: for bad arguments; the message names the offending shape.
  """
  return _normalize("layer_norm", x, gamma, beta, residual=residual, eps=eps,
                    out_dtype=out_dtype, quantize=quantize,
                    implementation=implementation, interpret=interpret,
                    config=config, backward_config=backward_config)


def rms_norm(x, gamma, *, residual=None, eps: float = 1e-6, out_dtype=None,
             quantize: str | None = None,
             implementation: Implementation | None = None,
             interpret: bool | None = None,
             config: config_lib.Config | None = None,
             backward_config: config_lib.Config | None = None) -> Any:
  """RMS norm over the last axis with optional fused residual add.

  `y = h / sqrt(mean(h**2) + eps) * gamma` with float32 statistics; `h`, the
  epilogues, the return structure and every option are as in `layer_norm`.
  """
  return _normalize("rms_norm", x, gamma, None, residual=residual, eps=eps,
                    out_dtype=out_dtype, quantize=quantize,
                    implementation=implementation, interpret=interpret,
                    config=config, backward_config=backward_config)

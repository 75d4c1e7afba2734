"""`pallas_kernels.matmul`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul import vjp
from pallas_kernels._src.ops.matmul.config import Config, MosaicConfig

IMPLEMENTATIONS = ("pallas", "xla")


def _shape(a) -> tuple[int, ...]:
  return tuple(int(d) for d in a.shape)


def _check_clamp(clamp) -> tuple[float | None, float | None] | None:
  if clamp is None:
    return None
  try:
    lo, hi = clamp
  except (TypeError, ValueError):
    raise ValueError(f"clamp must be a (lo, hi) pair, got {clamp!r}") from None
  lo = None if lo is None else float(lo)
  hi = None if hi is None else float(hi)
  if lo is not None and hi is not None and lo > hi:
    raise ValueError(f"clamp lo {lo} > hi {hi}")
  return lo, hi


def _real_numeric(name: str, a) -> None:
  dt = jnp.dtype(a.dtype)
  if not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
    raise ValueError(f"{name} must be a real floating or integer array, got "
                     f"{dt.name}{list(_shape(a))}")


def _mosaic_plan(x, w, m, n, k, cdt, odt, *, bias, residual, scale, x_kind, w_kind, group,
                 quantize, act, clamp, transpose_x, transpose_w, transpose_out, precision,
                 interp, target, config, column_sum, act_grad):
  """(Mosaic GPU tiling, the tiling with room for the backward's aux, why the
  kernel cannot run the call or None)."""
  col_vectors = sum((w_kind in ("scalar", "channel") or x_kind == "scalar",
                     scale is not None, bias is not None))
  aux = jnp.dtype(vjp.aux_dtype(odt)) if (act != "identity" or clamp is not None
                                           or scale is not None) else None
  common = dict(x_dtype=x.dtype, w_dtype=w.dtype, compute_dtype=cdt,
                out_dtype=quantize or odt, residual_dtype=None if residual is None
                else residual.dtype, col_vectors=col_vectors, row_scale=x_kind == "row",
                group_size=group, transpose_x=transpose_x, transpose_w=transpose_w)
  if config is not None:
    cfg = aux_cfg = config
  else:
    cfg = config_lib.heuristic_mosaic_config(
        m, n, k, fused_quantize=quantize is not None, device_kind=target.device_kind,
        **common)
    aux_cfg = config_lib.heuristic_mosaic_config(
        m, n, k, fused_quantize=quantize is not None, device_kind=target.device_kind,
        aux_dtype=aux, **common) if aux is not None and quantize is None else cfg
  reason = guard.mosaic_unsupported_reason(
      x, w, out_dtype=odt, bias=bias, residual=residual, scale=scale, group_size=group,
      quantize=quantize, transpose_x=transpose_x, transpose_w=transpose_w,
      transpose_out=transpose_out, precision=precision, interpret=interp, config=cfg,
      col_vectors=col_vectors, row_scale=x_kind == "row", column_sum=column_sum,
      activation_grad=act_grad is not None)
  return cfg, aux_cfg, reason


def matmul(x: jax.Array, w: jax.Array, *, bias: jax.Array | None = None,
           activation: str | None = None, residual: jax.Array | None = None,
           out_dtype: Any = None, scale: jax.Array | float | None = None,
           clamp: tuple[float | None, float | None] | None = None,
           x_scale: jax.Array | float | None = None,
           w_scale: jax.Array | float | None = None, w_group_size: int | None = None,
           transpose_x: bool = False, transpose_w: bool = False,
           transpose_out: bool = False, quantize: str | None = None,
           implementation: str | None = None, interpret: bool | None = None,
           config: Config | MosaicConfig | None = None, precision: Any = None,
           backend: str | None = None, w_column_sum: bool = False,
           activation_grad: str | None = None, preactivation: jax.Array | None = None):
  """`x @ w` with a fused dequantizing prologue and a fused epilogue.

  Computes, in float32 from the accumulator on (x_l, w_l are the logical
  operands, i.e. after the transpose flags)::

    acc = (x_l * x_scale[..., None]) @ (w_l * w_scale)   # f32 accumulation
    y   = acc * scale                                    # 1. scale
    y   = y + bias                                       # 2. bias
    y   = act(y)                                         # 3. activation
          or  y * act'(preactivation)                    #    (activation_grad)
    y   = y + residual                                   # 4. residual add
    y   = clip(y, lo, hi)                                # 5. clamp
    out = y.astype(out_dtype)  or  quantize(y) per row   # 6. cast / quantize

  The jnp equivalent (see `reference.reference` for the exact code)::

    xd = jnp.swapaxes(x, -1, -2) if transpose_x else x
    wd = jnp.swapaxes(w, -1, -2) if transpose_w else w
    xd = xd.astype(f32) * x_scale[..., None]
    wd = wd.astype(f32) * jnp.repeat(w_scale, G, axis=0)[:K]  # or * w_scale
    y = jnp.matmul(xd, wd, preferred_element_type=f32)
    y = jnp.clip(act(y * scale + bias) + residual, lo, hi).astype(out_dtype)
    out = jnp.swapaxes(y, -1, -2) if transpose_out else y

  Args:
    x: [..., M, K] ([..., K, M] if transpose_x): float32/bfloat16/float16, or
      int8 / float8_e4m3fn / float8_e5m2 with an optional `x_scale`.
    w: [..., K, N] ([..., N, K] if transpose_w): float, int8, int4 or fp8 with
      an optional `w_scale`. Batch dims of x and w broadcast like jnp.matmul.
    bias: [N], added after `scale`.
    activation: None/"identity", "relu", "gelu" (exact erf form, as
      jax.nn.gelu(approximate=False)), "gelu_tanh", "silu", "sigmoid", "tanh".
    residual: added after the activation; the result's shape (so [..., N, M]
      when transpose_out).
    activation_grad: an `activation` name whose derivative at
      `preactivation` multiplies the product in step 3 instead of an
      activation (cuBLASLt's DGELU epilogue): in an MLP's backward,
      `matmul(dy, w2, transpose_w=True, activation_grad="gelu",
      preactivation=z)` is dz = (dy @ w2^T) * gelu'(z) without writing
      dy @ w2^T. Takes neither `bias` nor `activation`; scale, residual,
      clamp, out_dtype, quantize and w_column_sum compose as usual. The
      Mosaic GPU kernel does not fuse it (the call runs on Triton, recorded
      as the backend choice).
    preactivation: z, the activation's input saved by the forward pass:
      the result's shape (like `residual`), any float dtype; required with
      `activation_grad` and only with it.
    out_dtype: result dtype; default x's dtype, or for an int8/fp8 x the
      dequantized compute dtype (w's float dtype, else bfloat16).
    scale: epilogue multiplier, scalar or [N], applied to the accumulator first.
    clamp: (lo, hi) bounds applied last (either may be None).
    x_scale: dequantization scale of x: scalar or per logical row [..., M].
    w_scale: dequantization scale of w: scalar, per output channel [N], or per
      group of `w_group_size` rows along K: [ceil(K / G), N]. Scales are in the
      logical [K, N] orientation whatever transpose_w says.
    w_group_size: G for per-group w scales (e.g. 32/64/128 for int4).
    transpose_x: x is stored [..., K, M] and read in place (no transpose copy).
    transpose_w: w is stored [..., N, K] (PyTorch's Linear layout).
    transpose_out: store the result transposed, [..., N, M].
    quantize: None, "int8" or "float8_e4m3fn": return (values, scales) with
      float32 scales per logical row (amax / qmax, 1 for zero rows) shaped
      [..., M, 1] ([..., 1, M] when transpose_out) so that
      `values.astype(f32) * scales` approximates the result; values =
      quantize(y / scales) (see `pallas_kernels._src.ops.quantize`).
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly when no GPU/TPU.
    config: tiling: a `Config` (Triton; on a TPU target, its block sizes
      rounded up to 128 are the Mosaic TPU kernel's tiles) or a `MosaicConfig`
      (Mosaic GPU); None picks the backend's heuristic.
    precision: of float32 dots, as for `jnp.matmul`: None (JAX's
      `jax_default_matmul_precision`, else DEFAULT), a `jax.lax.Precision` or
      its name. On a GPU, DEFAULT and HIGH run TF32 tensor cores, as XLA does
      for the same jnp call; HIGHEST runs IEEE fp32. 16-bit and quantized
      operands are unaffected. The XLA implementation uses the same precision.
      The Mosaic GPU kernel runs float32 as TF32 only: HIGHEST runs on Triton.
    backend: the Pallas backend of the GPU kernels: "mosaic_gpu" (Hopper:
      TMA, wgmma, warp specialization; jax >= 0.11), "triton", or None: Mosaic
      GPU on a Hopper target when its guard accepts the call, else Triton. The
      target is the device the operands are placed on (see
      `pallas_kernels._src.backend`), never the default backend. A named
      backend whose guard rejects the call falls back to XLA (recorded). On a
      TPU target, None runs the Mosaic TPU kernel (`tpu.py`; no dequantizing
      prologue, quantize or column sums there: those fall back, recorded).
    w_column_sum: also return `colsum = sum(w_l, axis=-2)` in float32, the
      sums of the logical w over the contraction axis: [N], or w's own batch
      dims + [N] for a batched w (cuBLASLt's BGRADB epilogue). For
      `matmul(x, dy, transpose_x=True, w_column_sum=True)` with activations
      x [tokens, K] and dy [tokens, N] that is (dW, db) of a dense layer in
      one pass over dy. The Triton kernel sums the w tiles it loads; the
      Mosaic GPU kernel does not (the call runs on Triton, recorded as the
      backend choice), nor does any kernel for a w with `w_scale` (the XLA
      reference sums the dequantized w; a recorded fallback).

  Returns:
    The result [..., M, N] (or [..., N, M]) in out_dtype, or (values, scales)
    when quantizing; with w_column_sum, the pair (that, colsum).
    Differentiable with respect to float x and w, bias, scale, residual and
    preactivation (quantized operands and dequantization scales are
    constants); colsum's cotangent reaches w. With activation_grad the
    epilogue's derivatives (act'' for preactivation) are XLA's, the dx and
    dw products the kernel's.

  Raises:
    ValueError: for invalid calls: mismatched K, non-broadcastable batch dims,
      misshapen bias/residual/scale/x_scale/w_scale/preactivation, unknown
      activation, implementation or quantize kind, both quantize and
      out_dtype, activation_grad without preactivation (or the reverse) or
      with bias or an activation. A call
      the kernel cannot run (dtype, backend, shape limits) is not an error: it
      runs the XLA reference and is recorded in `pallas_kernels` fallbacks.
  """
  x = jnp.asarray(x)
  w = jnp.asarray(w)
  _real_numeric("x", x)
  _real_numeric("w", w)
  if x.ndim < 2 or w.ndim < 2:
    raise ValueError(f"x and w need at least 2 dims, got x{list(_shape(x))} "
                     f"w{list(_shape(w))}")
  if implementation not in (None,) + IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None, got "
                     f"{implementation!r}")
  if config is not None and not isinstance(config, (Config, MosaicConfig)):
    raise ValueError(f"config must be a matmul Config or MosaicConfig, got "
                     f"{type(config).__name__}")
  if backend not in (None,) + backend_lib.KERNEL_BACKENDS:
    raise ValueError(f"backend must be one of {backend_lib.KERNEL_BACKENDS} or None, got "
                     f"{backend!r}")
  if isinstance(config, MosaicConfig) and backend == "triton":
    raise ValueError("a MosaicConfig configures the Mosaic GPU kernel, not backend='triton'")
  if isinstance(config, Config) and backend == "mosaic_gpu":
    raise ValueError("a Config configures the Triton kernel, not backend='mosaic_gpu'")
  if not isinstance(w_column_sum, bool):
    raise ValueError(f"w_column_sum must be a bool, got {w_column_sum!r}")
  act = reference.canonical_activation(activation)
  act_grad = None
  if activation_grad is not None:
    act_grad = reference.canonical_activation(activation_grad)
    if preactivation is None:
      raise ValueError(f"activation_grad={activation_grad!r} multiplies by the derivative "
                       "at preactivation: pass preactivation (the activation's input)")
    if bias is not None:
      raise ValueError("activation_grad takes no bias: the bias belongs to the forward "
                       "product whose output is preactivation")
    if act != "identity":
      raise ValueError(f"activation_grad replaces the activation step: pass either "
                       f"activation={activation!r} or activation_grad={activation_grad!r}")
  elif preactivation is not None:
    raise ValueError("preactivation is read only with activation_grad (the activation "
                     "whose derivative it takes)")
  clamp = _check_clamp(clamp)
  prec = gpu.resolve_precision(precision)
  if quantize is not None and quantize not in quant.KINDS:
    raise ValueError(f"quantize must be one of {quant.KINDS} or None, got {quantize!r}")
  if quantize is not None and out_dtype is not None:
    raise ValueError("pass either quantize or out_dtype, not both")

  m, n, k = guard.dims(x.shape, w.shape, transpose_x, transpose_w)
  k_w = w.shape[-1] if transpose_w else w.shape[-2]
  if k != k_w:
    raise ValueError(
        f"contraction mismatch: x{list(_shape(x))} (transpose_x={transpose_x}) has "
        f"K={k} but w{list(_shape(w))} (transpose_w={transpose_w}) has K={k_w}")
  try:
    batch = tuple(jnp.broadcast_shapes(_shape(x)[:-2], _shape(w)[:-2]))
  except ValueError:
    raise ValueError(f"batch dims of x{list(_shape(x))} and w{list(_shape(w))} do not "
                     "broadcast") from None
  result_shape = batch + ((n, m) if transpose_out else (m, n))

  if bias is not None:
    bias = jnp.asarray(bias)
    if _shape(bias) != (n,):
      raise ValueError(f"bias must have shape [N]=[{n}], got {list(_shape(bias))}")
  if residual is not None:
    residual = jnp.asarray(residual)
    if _shape(residual) != result_shape:
      raise ValueError(f"residual must have the result's shape {list(result_shape)}, got "
                       f"{list(_shape(residual))}")
  if preactivation is not None:
    preactivation = jnp.asarray(preactivation)
    if _shape(preactivation) != result_shape:
      raise ValueError(f"preactivation must have the result's shape {list(result_shape)}, "
                       f"got {list(_shape(preactivation))}")
    if not jnp.issubdtype(preactivation.dtype, jnp.floating):
      raise ValueError(f"preactivation must be floating, got "
                       f"{jnp.dtype(preactivation.dtype).name}")
  if scale is not None:
    scale = jnp.asarray(scale, None if hasattr(scale, "dtype") else jnp.float32)
    if _shape(scale) not in ((), (n,)):
      raise ValueError(f"scale must be a scalar or [N]=[{n}], got {list(_shape(scale))}")

  x_kind = "none"
  if x_scale is not None:
    x_scale = jnp.asarray(x_scale, None if hasattr(x_scale, "dtype") else jnp.float32)
    rows = _shape(x)[:-2] + (m,)
    if x_scale.ndim == 0:
      x_kind = "scalar"
    elif x_scale.shape[-1] == m and len(x_scale.shape) <= len(rows) and all(
        a in (1, b) for a, b in zip(_shape(x_scale)[::-1], rows[::-1])):
      x_kind = "row"
    else:
      raise ValueError(f"x_scale must be a scalar or per row {list(rows)} of x"
                       f"{list(_shape(x))}, got {list(_shape(x_scale))}")

  w_kind, group = "none", None
  if w_group_size is not None and (not isinstance(w_group_size, int) or w_group_size < 1):
    raise ValueError(f"w_group_size must be a positive int, got {w_group_size!r}")
  if w_scale is not None:
    w_scale = jnp.asarray(w_scale, None if hasattr(w_scale, "dtype") else jnp.float32)
    if w_group_size is not None:
      want = (reference.num_groups(k, w_group_size), n)
      if _shape(w_scale) != want:
        raise ValueError(f"per-group w_scale for w{list(_shape(w))} with w_group_size="
                         f"{w_group_size} must have shape {list(want)}, got "
                         f"{list(_shape(w_scale))}")
      w_kind, group = "group", w_group_size
    elif w_scale.ndim == 0:
      w_kind = "scalar"
    elif _shape(w_scale) == (n,):
      w_kind = "channel"
    else:
      raise ValueError(f"w_scale for w{list(_shape(w))} must be a scalar or [N]=[{n}] "
                       f"(or [K // G, N] with w_group_size), got {list(_shape(w_scale))}")
  elif w_group_size is not None:
    raise ValueError("w_group_size needs a per-group w_scale")
  for label, a in (("scale", scale), ("x_scale", x_scale), ("w_scale", w_scale)):
    if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
      raise ValueError(f"{label} must be floating, got {jnp.dtype(a.dtype).name}")

  cdt = reference.compute_dtype(x.dtype, w.dtype)
  odt = (jnp.dtype(out_dtype) if out_dtype is not None
         else reference.default_out_dtype(x.dtype, w.dtype))
  operands = (x, w, bias, residual, scale, x_scale, w_scale, preactivation)
  needs_aux = (act != "identity" or clamp is not None or scale is not None
               or act_grad is not None)

  def launch(interp: bool):
    impl = implementation or backend_lib.default_implementation(interpret)
    target = backend_lib.target()
    signature = guard_lib.signature(**dict(zip(vjp.Operands.NAMES, operands)))
    # The Pallas backend: the caller's, else the target's (Mosaic GPU on Hopper).
    kernel_backend, why = backend, ""
    if isinstance(config, MosaicConfig):
      kernel_backend = "mosaic_gpu"
    elif isinstance(config, Config):
      kernel_backend = "triton"
    preferred, not_preferred = backend_lib.preferred_kernel_backend(target, interp)
    # A TPU target runs the Mosaic TPU kernel unless the caller named a GPU
    # backend (a `Config`'s tiles are its tile request, `tpu.plan`).
    on_tpu = (target.backend is backend_lib.Backend.TPU and backend is None
              and not isinstance(config, MosaicConfig))
    if on_tpu:
      kernel_backend, why = tpu_lib.KERNEL_BACKEND, ""
    elif kernel_backend is None:
      kernel_backend, why = preferred, not_preferred
    mosaic_cfg = mosaic_aux_cfg = None
    if kernel_backend == "mosaic_gpu" and impl == "pallas":
      mosaic_cfg, mosaic_aux_cfg, reason = _mosaic_plan(
          x, w, m, n, k, cdt, odt, bias=bias, residual=residual, scale=scale,
          x_kind=x_kind, w_kind=w_kind, group=group, quantize=quantize, act=act,
          clamp=clamp, transpose_x=transpose_x, transpose_w=transpose_w,
          transpose_out=transpose_out, precision=prec, interp=interp, target=target,
          config=config if isinstance(config, MosaicConfig) else None,
          column_sum=w_column_sum, act_grad=act_grad)
      if reason is not None:
        if backend == "mosaic_gpu" or isinstance(config, MosaicConfig):
          guard_lib.record_fallback("matmul", f"mosaic_gpu: {reason}", signature)
          kernel_backend = None  # The caller asked for it: XLA, not Triton.
        else:
          kernel_backend, why = "triton", f"mosaic_gpu: {reason}"
    # The kernel folds x's batch into M when w has no batch (see kernel.py).
    folded = not transpose_x and not transpose_out and math.prod(_shape(w)[:-2]) == 1
    cfg = config if isinstance(config, Config) else config_lib.choose_config(
        m * (math.prod(_shape(x)[:-2]) if folded else 1), n, k,
        cdt, interp, group_size=group, fused_quantize=quantize is not None,
        packed_n=jnp.dtype(w.dtype).name == "int4" and not transpose_w, precision=prec)
    static = vjp.Static(
        activation=act, clamp=clamp, out_dtype=odt.name, compute_dtype=jnp.dtype(cdt).name,
        quantize=quantize, transpose_x=bool(transpose_x), transpose_w=bool(transpose_w),
        transpose_out=bool(transpose_out), x_scale_kind=x_kind, w_scale_kind=w_kind,
        group_size=group, config=cfg, interpret=interp, backend=target.backend,
        target=target, precision=prec, kernel_backend=kernel_backend or "triton",
        mosaic_config=mosaic_cfg, mosaic_aux_config=mosaic_aux_cfg,
        w_column_sum=w_column_sum, activation_grad=act_grad,
        tpu_request=(config.block_m, config.block_n, config.block_k)
        if on_tpu and isinstance(config, Config) else None)
    if impl == "xla" or kernel_backend is None:
      return vjp.reference_call(static, *operands)
    if kernel_backend == "triton":
      reason = guard.unsupported_reason(
          x, w, out_dtype=odt, bias=bias, residual=residual, scale=scale,
          group_size=group, quantize=quantize, transpose_x=transpose_x,
          transpose_w=transpose_w, backend=static.backend, interpret=interp, config=cfg,
          column_sum=w_column_sum, w_scale=w_scale, preactivation=preactivation)
      if reason is not None:
        guard_lib.record_fallback("matmul", reason, signature)
        return vjp.reference_call(static, *operands)
    elif kernel_backend == tpu_lib.KERNEL_BACKEND:
      reason = guard.tpu_unsupported_reason(
          x, w, out_dtype=odt, bias=bias, residual=residual, scale=scale, x_scale=x_scale,
          w_scale=w_scale, quantize=quantize, column_sum=w_column_sum,
          transpose_x=transpose_x, transpose_w=transpose_w, transpose_out=transpose_out,
          aux_dtype=vjp.aux_dtype(odt) if needs_aux else None,
          requested=static.tpu_request, preactivation=preactivation)
      if reason is not None:
        guard_lib.record_fallback("matmul", reason, signature)
        return vjp.reference_call(static, *operands)
    guard_lib.record_choice("matmul", kernel_backend, why, signature)
    return vjp.build(static)(*operands)

  if implementation == "xla":
    return launch(backend_lib.resolve_interpret(interpret))
  return backend_lib.dispatch(interpret, operands, launch)

"""custom_vjp wiring of the matmul kernels.

Forward under differentiation: the forward kernel also stores `aux`, the
accumulator (x @ w after dequantization) before the epilogue, whenever the
epilogue has something to differentiate through (an activation, a clamp, or a
`scale`). Trade-off, as cuBLASLt's GELU_AUX: saving aux costs M*N elements of
memory (in the output dtype, float32 for float32 outputs) and one extra store
in the forward; recomputing it instead would cost a second full matmul
(2*M*N*K flops) in the backward. For any K beyond a few dozen, storing wins.

Backward (kernel path):
  1. `kernel.dact_bgrad`: one pass over dy computes g = dy * clamp_mask *
     act'(aux * scale + bias), the bias gradient sum_rows(g), the scale
     gradient sum_rows(g * aux), and writes g * scale (times the per-column w
     scale and per-row x scale, folded in so that the dequantization needs no
     second pass). Without activation/clamp/scale, g is dy itself (no kernel;
     the bias gradient is an XLA reduction).
  2. dx = g @ w^T and dw = x^T @ g are the forward kernel again, reading the
     transposed operands in place through its transpose flags (no transposes
     are materialized). Batch dims that were broadcast are summed afterwards.
Gradients: x and w (float dtypes only; int8/int4/fp8 operands are constants,
as are x_scale and w_scale), bias, scale, and residual (identity, masked by a
clamp). Per-group w scales are applied to w in XLA for dx (one dequantized
copy of w), since they vary along dx's output axis.

Column sums of w (`w_column_sum`): colsum[n] = sum_k w_l[k, n], so its
cotangent adds dcolsum[n] to every dw[k, n]. Where the dw product stores w's
gradient directly (w unbatched, no broadcast batch summed after), that is the
dw kernel's bias epilogue (bias is added per logical column, before the
transposed store); otherwise XLA adds it to the f32 dw before the one cast.

On a TPU (kernel_backend "mosaic_tpu") the dx and dw products are the
Mosaic TPU kernel (`tpu.py`) and step 1 is `jax.vjp` of the reference
epilogue at aux, in XLA: there is no fused dAct + bias-gradient kernel there.

With `activation_grad` (y = acc * scale * act'(z), a backward pass's own
product, differentiated only by second-order autodiff) step 1 is that same
`jax.vjp` of the reference epilogue at aux on every backend: it also gives
z's gradient, acc * scale * act''(z) times dy, which `dact_bgrad` does not
compute; dx and dw stay the kernels'.

When the backward kernels cannot run (a guard reason for the dx/dw launches)
or the output is quantized, the backward is `jax.vjp` of the reference,
recorded as a fallback when traced.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul import kernel
from pallas_kernels._src.ops.matmul import mosaic_gpu
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul import tpu as matmul_tpu
from pallas_kernels._src.ops.matmul.config import Config, MosaicConfig

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  activation: str
  clamp: tuple[float | None, float | None] | None
  out_dtype: str
  compute_dtype: str
  quantize: str | None
  transpose_x: bool
  transpose_w: bool
  transpose_out: bool
  #: "none" | "scalar" | "row" (per row of logical x).
  x_scale_kind: str
  #: "none" | "scalar" | "channel" ([N]) | "group" ([K // G, N]).
  w_scale_kind: str
  group_size: int | None
  config: Config
  interpret: bool
  backend: backend_lib.Backend
  #: The device traced for; the VJP rules, traced later, re-enter it.
  target: backend_lib.Target
  #: `jax.lax.Precision` name of the f32 dots (`gpu.resolve_precision`).
  precision: str = "HIGHEST"
  #: The Pallas backend of the kernels: "triton", "mosaic_gpu" or "mosaic_tpu".
  kernel_backend: str = "triton"
  #: The Mosaic GPU tiling (kernel_backend "mosaic_gpu"), and the one with
  #: room for the aux the backward saves.
  mosaic_config: MosaicConfig | None = None
  mosaic_aux_config: MosaicConfig | None = None
  #: Also return the float32 column sums of the logical w (see `api.matmul`).
  w_column_sum: bool = False
  #: The caller's `Config` tiles (block_m, block_n, block_k) for the Mosaic
  #: TPU kernel, or None: its heuristic (`tpu.plan`).
  tpu_request: tuple[int, int, int] | None = None
  #: The activation whose derivative at `preactivation` replaces the
  #: activation step (see `api.matmul`), or None.
  activation_grad: str | None = None


class Operands:
  """Names for the eight array arguments, in custom_vjp order."""

  NAMES = ("x", "w", "bias", "residual", "scale", "x_scale", "w_scale", "preactivation")


def reference_call(static: Static, x, w, bias, residual, scale, x_scale, w_scale,
                   preactivation=None):
  """The reference at HIGHEST precision with `static`'s options."""
  return reference.reference(
      x, w, bias=bias, activation=static.activation, residual=residual,
      out_dtype=static.out_dtype, scale=scale, clamp=static.clamp,
      x_scale=x_scale, w_scale=w_scale,
      w_group_size=static.group_size if static.w_scale_kind == "group" else None,
      transpose_x=static.transpose_x, transpose_w=static.transpose_w,
      transpose_out=static.transpose_out, quantize=static.quantize,
      precision=jax.lax.Precision[static.precision], w_column_sum=static.w_column_sum,
      activation_grad=static.activation_grad, preactivation=preactivation)


def _col_mult(static: Static, n: int, x_scale, w_scale):
  """The f32 [N] column factor: scalar x scale times scalar/per-channel w scale."""
  col = None
  if static.w_scale_kind in ("scalar", "channel"):
    col = jnp.broadcast_to(jnp.asarray(w_scale, _F32), (n,))
  if static.x_scale_kind == "scalar":
    xs = jnp.asarray(x_scale, _F32)
    col = jnp.broadcast_to(xs, (n,)) if col is None else col * xs
  return col


def _row_mult(static: Static, x_scale):
  return jnp.asarray(x_scale, _F32) if static.x_scale_kind == "row" else None


def aux_dtype(out_dtype) -> jnp.dtype:
  out = jnp.dtype(out_dtype)
  if out.name in ("bfloat16", "float16"):
    return out
  # float32 results keep float32; fp8 results save bf16 (their own precision
  # would wreck the activation's derivative).
  return jnp.dtype(_F32) if out.itemsize >= 4 else jnp.dtype(jnp.bfloat16)


def _needs_aux(static: Static, scale) -> bool:
  return (static.activation != "identity" or static.clamp is not None or scale is not None
          or static.activation_grad is not None)


def fuses_quantize(static: Static, n: int) -> bool:
  """Whether the kernel quantizes per row itself: one tile spans each row
  (else it stores f32 and XLA quantizes, the row max needing the whole row)."""
  if static.quantize is None:
    return False
  if static.kernel_backend == "mosaic_gpu":
    c = static.mosaic_config
    return (c.wg_dimension == "m" or c.compute_wgs == 1) and c.tile_n >= n
  return static.config.block_n >= n


def forward(static: Static, x, w, bias, residual, scale, x_scale, w_scale,
            preactivation=None, *, save_aux: bool = False) -> kernel.ForwardOutputs:
  """Runs the forward kernel for a validated call (quantizing wide rows via XLA)."""
  m, n, k = guard.dims(x.shape, w.shape, static.transpose_x, static.transpose_w)
  fused_quantize = fuses_quantize(static, n)
  out_dtype = static.out_dtype if static.quantize is None or fused_quantize else _F32
  if static.kernel_backend == "mosaic_tpu":
    # `guard.tpu_unsupported_reason` ruled out scales, quantize and column sums.
    return matmul_tpu.matmul_forward(
        x, w, interpret=static.interpret, compute_dtype=static.compute_dtype,
        out_dtype=out_dtype, activation=static.activation,
        scale=None if scale is None else jnp.broadcast_to(jnp.asarray(scale), (n,)),
        bias=bias, residual=residual, clamp=static.clamp, transpose_x=static.transpose_x,
        transpose_w=static.transpose_w, transpose_out=static.transpose_out,
        save_aux=save_aux, aux_dtype=aux_dtype(static.out_dtype),
        precision=static.precision, requested=static.tpu_request,
        activation_grad=static.activation_grad, preactivation=preactivation)
  if static.kernel_backend == "mosaic_gpu":
    # `guard.mosaic_unsupported_reason` sends column sums and activation
    # derivatives to Triton.
    assert not static.w_column_sum and static.activation_grad is None
    cfg = static.mosaic_aux_config if save_aux else static.mosaic_config
    launch = functools.partial(mosaic_gpu.matmul_forward, cfg=cfg)
  else:
    launch = functools.partial(kernel.matmul_forward, cfg=static.config,
                               column_sum=static.w_column_sum,
                               activation_grad=static.activation_grad,
                               preactivation=preactivation)
  res = launch(
      x, w, interpret=static.interpret, compute_dtype=static.compute_dtype,
      out_dtype=out_dtype, activation=static.activation,
      x_row_scale=_row_mult(static, x_scale),
      w_col_scale=_col_mult(static, n, x_scale, w_scale),
      w_group_scale=w_scale if static.w_scale_kind == "group" else None,
      group_size=static.group_size,
      scale=None if scale is None else jnp.broadcast_to(jnp.asarray(scale), (n,)),
      bias=bias, residual=residual, clamp=static.clamp,
      transpose_x=static.transpose_x, transpose_w=static.transpose_w,
      transpose_out=static.transpose_out,
      quantize=static.quantize if fused_quantize else None, save_aux=save_aux,
      aux_dtype=aux_dtype(static.out_dtype), precision=static.precision)
  if static.quantize is not None and not fused_quantize:
    # Rows wider than one tile: the kernel stored f32 y, XLA quantizes it (its
    # amax needs the whole row) in one fused elementwise pass.
    y = res.out
    axis = -2 if static.transpose_out else -1
    scales = quant.scale_from_amax(jnp.max(jnp.abs(y), axis=axis, keepdims=True),
                                   static.quantize)
    values = quant.quantize(y, scales, static.quantize)
    return kernel.ForwardOutputs(values, scales, res.aux, res.column_sum)
  return res


def result(static: Static, outputs: kernel.ForwardOutputs):
  """The public return value: the array, or (values, scales) when quantizing;
  paired with the column sums when asked."""
  out = (outputs.out, outputs.scales) if static.quantize is not None else outputs.out
  return (out, outputs.column_sum) if static.w_column_sum else out


# --------------------------------------------------------------------------
# Backward.
# --------------------------------------------------------------------------


def _spec(shape, dtype):
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


@dataclasses.dataclass(frozen=True)
class _GradLaunch:
  """How one dx/dw product runs: its backend, tiling, and whether its
  operands are swapped ((A B)^T = B^T A^T stores a transposed result
  row-major, which the Mosaic GPU kernel needs)."""

  backend: str
  #: None for "mosaic_tpu" (its tiles follow from the shapes, `tpu.plan`).
  config: Config | MosaicConfig | None
  swap: bool


def _grad_launch(static: Static, lhs, rhs, tl: bool, tr: bool, to: bool,
                 out_dtype) -> tuple[_GradLaunch | None, str | None]:
  """(how lhs @ rhs runs as a kernel, None) or (None, why it cannot)."""
  cdt = reference.compute_dtype(lhs.dtype, rhs.dtype)
  if static.kernel_backend == "mosaic_tpu":
    reason = guard.tpu_unsupported_reason(lhs, rhs, out_dtype=out_dtype, transpose_x=tl,
                                          transpose_w=tr, transpose_out=to)
    return (None, reason) if reason else (_GradLaunch("mosaic_tpu", None, swap=False), None)
  mosaic_why = None
  if static.kernel_backend == "mosaic_gpu":
    a, b, ta, tb = (rhs, lhs, not tr, not tl) if to else (lhs, rhs, tl, tr)
    m, n, k = guard.dims(a.shape, b.shape, ta, tb)
    cfg = config_lib.heuristic_mosaic_config(
        m, n, k, x_dtype=a.dtype, w_dtype=b.dtype, compute_dtype=cdt, out_dtype=out_dtype,
        transpose_x=ta, transpose_w=tb, device_kind=static.target.device_kind)
    mosaic_why = guard.mosaic_unsupported_reason(
        a, b, out_dtype=out_dtype, transpose_x=ta, transpose_w=tb, precision=static.precision,
        interpret=static.interpret, config=cfg, col_vectors=0, row_scale=False)
    if mosaic_why is None:
      return _GradLaunch("mosaic_gpu", cfg, swap=to), None
  m, n, k = guard.dims(lhs.shape, rhs.shape, tl, tr)
  cfg = config_lib.choose_config(m, n, k, cdt, static.interpret,
                                 packed_n=jnp.dtype(rhs.dtype).name == "int4" and not tr,
                                 precision=static.precision)
  reason = guard.unsupported_reason(
      lhs, rhs, out_dtype=out_dtype, transpose_x=tl, transpose_w=tr,
      backend=static.backend, interpret=static.interpret, config=cfg)
  if reason is not None:
    return None, reason if mosaic_why is None else f"{mosaic_why}; Triton: {reason}"
  return _GradLaunch("triton", cfg, swap=False), None


def _grad_matmul_reason(static: Static, lhs, rhs, tl: bool, tr: bool, out_dtype,
                        to: bool = False) -> str | None:
  return _grad_launch(static, lhs, rhs, tl, tr, to, out_dtype)[1]


def _plan(static: Static, x, w):
  """(dx wanted, dw wanted) and why the kernel backward cannot run (or None)."""
  if static.quantize is not None:
    return False, False, "quantized outputs are differentiated through the reference"
  want_dx = not reference.is_quantized(x.dtype)
  want_dw = not reference.is_quantized(w.dtype)
  m, n, _ = guard.dims(x.shape, w.shape, static.transpose_x, static.transpose_w)
  batch = jnp.broadcast_shapes(tuple(x.shape[:-2]), tuple(w.shape[:-2]))
  g = _spec(tuple(batch) + (m, n), static.compute_dtype)
  if want_dx:
    w_for = _spec(w.shape, static.compute_dtype) if static.w_scale_kind == "group" else w
    reason = _grad_matmul_reason(static, g, w_for, False, not static.transpose_w, _F32,
                                 to=static.transpose_x)
    if reason:
      return want_dx, want_dw, f"dx matmul: {reason}"
  if want_dw:
    reason = _grad_matmul_reason(static, x, g, not static.transpose_x, False, _F32,
                                 to=static.transpose_w)
    if reason:
      return want_dx, want_dw, f"dw matmul: {reason}"
  return want_dx, want_dw, None


def _sum_to(a, shape, dtype):
  """Sums the leading broadcast batch dims of `a` down to `shape`, casts."""
  extra = a.ndim - len(shape)
  axes = tuple(range(extra)) + tuple(
      extra + i for i, d in enumerate(shape[:-2]) if d == 1 and a.shape[extra + i] != 1)
  if axes:
    a = jnp.sum(a.astype(_F32), axis=axes, keepdims=False)
    a = a.reshape(shape)
  return a.astype(dtype)


def _matmul_grad(static: Static, lhs, rhs, *, tl: bool, tr: bool, to: bool, out_dtype,
                 bias=None):
  """lhs @ rhs (+ bias [N] on the logical columns) through a forward kernel
  for dx / dw."""
  cdt = reference.compute_dtype(lhs.dtype, rhs.dtype)
  plan, reason = _grad_launch(static, lhs, rhs, tl, tr, to, out_dtype)
  assert plan is not None, reason  # `_plan` ruled this out before the forward.
  if plan.backend == "mosaic_tpu":
    assert bias is None  # Column sums, whose cotangent it carries, are not on TPU.
    return matmul_tpu.matmul_forward(
        lhs, rhs, interpret=static.interpret, compute_dtype=cdt, out_dtype=out_dtype,
        transpose_x=tl, transpose_w=tr, transpose_out=to, precision=static.precision).out
  if plan.backend == "mosaic_gpu":
    assert bias is None  # `_kernel_backward` adds it in XLA on this path.
    a, b, ta, tb = (rhs, lhs, not tr, not tl) if plan.swap else (lhs, rhs, tl, tr)
    return mosaic_gpu.matmul_forward(
        a, b, cfg=plan.config, interpret=static.interpret, compute_dtype=cdt,
        out_dtype=out_dtype, transpose_x=ta, transpose_w=tb).out
  return kernel.matmul_forward(
      lhs, rhs, cfg=plan.config, interpret=static.interpret, compute_dtype=cdt,
      out_dtype=out_dtype, transpose_x=tl, transpose_w=tr, transpose_out=to,
      precision=static.precision, bias=bias).out


def _dequantized_w_stored(static: Static, w, w_scale):
  """w times its per-group scales, in w's stored orientation and compute dtype."""
  k = w.shape[-1] if static.transpose_w else w.shape[-2]
  s = reference.expand_group_scale(w_scale, k, static.group_size)
  if static.transpose_w:
    s = s.T
  return (w.astype(_F32) * s).astype(static.compute_dtype)


def _epilogue_grads(static: Static, aux, ct, scale, bias, residual, preactivation=None,
                    col=None, row=None):
  """(g in the compute dtype, logical [..., M, N]; g transposed? (never);
  db [N]; dscale [N]; dres; dpreactivation) by `jax.vjp` of the reference
  epilogue at the saved accumulator `aux`; g times the column and row
  multipliers (`_col_mult`, `_row_mult`), as `kernel.dact_bgrad` folds them."""
  n = aux.shape[-1]
  vec = lambda v: None if v is None else jnp.broadcast_to(jnp.asarray(v, _F32), (n,))
  f32 = lambda a: None if a is None else a.astype(_F32)

  def epilogue(acc, s, b, r, z):
    return reference._epilogue(  # pylint: disable=protected-access
        acc, _F32, _F32, bias=b, activation=static.activation, residual=r,
        out_dtype=_F32, scale=s, clamp=static.clamp, transpose_out=static.transpose_out,
        quantize=None, activation_grad=static.activation_grad, preactivation=z)

  _, pullback = jax.vjp(epilogue, aux.astype(_F32), vec(scale), vec(bias), f32(residual),
                        f32(preactivation))
  g, dscale, db, dres, dpre = pullback(ct.astype(_F32))
  if col is not None:
    g = g * col
  if row is not None:
    g = g * row[..., None]
  return (g.astype(static.compute_dtype), False, db, dscale,
          ct if residual is None else dres, dpre)


def _kernel_backward(static: Static, inputs, aux, ct, want_dx: bool, want_dw: bool,
                     dcolsum=None):
  x, w, bias, residual, scale, x_scale, w_scale, preactivation = inputs
  m, n, _ = guard.dims(x.shape, w.shape, static.transpose_x, static.transpose_w)
  col = _col_mult(static, n, x_scale, w_scale)
  row = _row_mult(static, x_scale)
  cdt = jnp.dtype(static.compute_dtype)
  db = dscale = dpre = None
  if _needs_aux(static, scale) and (static.kernel_backend == "mosaic_tpu"
                                    or static.activation_grad is not None):
    # No fused dAct + bias-gradient kernel on a TPU, nor one taking act'' for
    # an activation derivative: XLA differentiates the reference epilogue at
    # the saved accumulator in one fused elementwise pass with its column
    # reductions; the two gemms below are the kernel.
    g, g_t, db, dscale, dres, dpre = _epilogue_grads(
        static, aux, ct, scale, bias, residual, preactivation, col, row)
  elif _needs_aux(static, scale):
    if static.kernel_backend != "triton":
      # An element-wise pass with column sums: no wgmma, no TMA tiles to gain.
      guard_lib.record_choice(
          "matmul", "triton", "the fused dAct + bias-gradient pass is Triton's",
          guard_lib.signature(dy=ct, aux=aux))
    bo = kernel.dact_bgrad(
        ct, aux, cfg=None, interpret=static.interpret, activation=static.activation,
        g_dtype=cdt, clamp=static.clamp, residual=residual,
        scale=None if scale is None else jnp.broadcast_to(jnp.asarray(scale), (n,)),
        bias=bias, col_mult=col, row_mult=row, transpose_out=static.transpose_out,
        want_db=bias is not None, want_dscale=scale is not None,
        res_dtype=None if residual is None else residual.dtype)
    g, g_t = bo.g, False
    db, dscale, dres = bo.db, bo.dscale, bo.dres
    if dres is None:
      dres = ct
  else:
    # Identity epilogue: the accumulator's cotangent is dy itself (times the
    # folded dequantization scales), in dy's stored layout.
    g, g_t, dres = ct, static.transpose_out, ct
    if bias is not None:
      db = jnp.sum(ct.astype(_F32), axis=tuple(a for a in range(ct.ndim)
                                               if a != (ct.ndim - 2 if g_t else ct.ndim - 1)))
    if col is not None or row is not None:
      gf = ct.astype(_F32)
      if col is not None:
        gf = gf * (col[:, None] if g_t else col)
      if row is not None:
        gf = gf * (row[..., None, :] if g_t else row[..., None])
      g = gf.astype(cdt)
    else:
      g = ct.astype(cdt)

  dx = dw = None
  if want_dx:
    w_for = _dequantized_w_stored(static, w, w_scale) if static.w_scale_kind == "group" else w
    full = _matmul_grad(static, g, w_for, tl=g_t, tr=not static.transpose_w,
                        to=static.transpose_x,
                        out_dtype=_F32 if g.ndim > x.ndim or g.shape[:-2] != x.shape[:-2]
                        else x.dtype)
    dx = _sum_to(full, x.shape, x.dtype)
  if want_dw:
    unbatched_w = math.prod(w.shape[:-2]) == 1
    fold = unbatched_w and not static.transpose_x and not g_t and x.ndim > 2
    grouped = static.w_scale_kind == "group"
    summed = not fold and (g.ndim > w.ndim or g.shape[:-2] != w.shape[:-2])
    # The column sums' cotangent: the dw kernel's bias where it stores dw
    # itself, else added in XLA below (before the one cast of an f32 dw).
    fused_dcs = (dcolsum is not None and unbatched_w and not summed and not grouped
                 and static.kernel_backend == "triton")
    dcs_bias = dcolsum.reshape(n).astype(_F32) if fused_dcs else None
    late_dcs = dcolsum is not None and not fused_dcs
    if fold:
      # Contract over batch and rows at once: [B*M, K]^T @ [B*M, N].
      k = x.shape[-1]
      full = _matmul_grad(static, x.reshape(-1, k), g.reshape(-1, n), tl=True, tr=False,
                          to=static.transpose_w,
                          out_dtype=_F32 if grouped or late_dcs else w.dtype, bias=dcs_bias)
      full = full.reshape(w.shape)
    else:
      # Stored straight in w's dtype unless broadcast batch dims are summed after.
      full = _matmul_grad(static, x, g, tl=not static.transpose_x, tr=g_t,
                          to=static.transpose_w,
                          out_dtype=_F32 if grouped or summed or late_dcs else w.dtype,
                          bias=dcs_bias)
    if grouped:
      k = w.shape[-1] if static.transpose_w else w.shape[-2]
      s = reference.expand_group_scale(w_scale, k, static.group_size)
      full = full * (s.T if static.transpose_w else s)
    if late_dcs:
      full = _sum_to(full, w.shape, _F32)
      dcs = dcolsum.astype(_F32)
      full = full + (dcs[..., :, None] if static.transpose_w else dcs[..., None, :])
    dw = _sum_to(full, w.shape, w.dtype)

  def cast(v, like):
    return None if like is None or v is None else v.astype(like.dtype).reshape(like.shape)

  dscale_out = None
  if scale is not None:
    dscale_out = dscale.reshape(jnp.shape(scale)) if jnp.ndim(scale) else jnp.sum(dscale)
    dscale_out = dscale_out.astype(jnp.asarray(scale).dtype)
  return (dx, dw, cast(db, bias), cast(dres, residual), dscale_out, None, None,
          cast(dpre, preactivation))


def _reference_backward(static: Static, inputs, ct):
  _, pullback = jax.vjp(functools.partial(reference_call, static), *inputs)
  grads = list(pullback(ct))
  # Quantized operands and dequantization scales are constants (see module doc).
  for i, name in enumerate(Operands.NAMES):
    a = inputs[i]
    if name in ("x_scale", "w_scale") or (
        name in ("x", "w") and reference.is_quantized(a.dtype)):
      grads[i] = None
  return tuple(grads)


@functools.lru_cache(maxsize=256)
def build(static: Static):
  """The differentiable Pallas matmul for `static`: f(x, w, bias, residual,
  scale, x_scale, w_scale, preactivation) -> result (or (values, scales))."""

  @jax.custom_vjp
  def fused(*inputs):
    with backend_lib.targeting(static.target):
      return result(static, forward(static, *inputs))

  def fused_fwd(*inputs):
    with backend_lib.targeting(static.target):
      return _fused_fwd(*inputs)

  def _fused_fwd(*inputs):
    x, w, scale = inputs[0], inputs[1], inputs[4]
    want_dx, want_dw, reason = _plan(static, x, w)
    if reason is not None:
      if static.quantize is None:
        guard_lib.record_fallback(
            "matmul", f"backward: {reason}",
            guard_lib.signature(**dict(zip(Operands.NAMES, inputs))))
      out = forward(static, *inputs)
      return result(static, out), (inputs, None)
    save = _needs_aux(static, scale)
    out = forward(static, *inputs, save_aux=save)
    return result(static, out), (inputs, out.aux)

  def fused_bwd(res, ct):
    with backend_lib.targeting(static.target):
      return _fused_bwd(res, ct)

  def _fused_bwd(res, ct):
    inputs, aux = res
    x, w = inputs[0], inputs[1]
    want_dx, want_dw, reason = _plan(static, x, w)
    if reason is not None:
      return _reference_backward(static, inputs, ct)
    dcolsum = None
    if static.w_column_sum:
      ct, dcolsum = ct
    return _kernel_backward(static, inputs, aux, ct, want_dx, want_dw, dcolsum)

  fused.defvjp(fused_fwd, fused_bwd)
  return fused

"""When the matmul kernel cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback (`pallas_kernels._src.guard`), so a
user's program never breaks. Genuinely invalid calls (mismatched K, bad scale
shapes) are not reasons: `api.py` raises ValueError for them.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import compat
from pallas_kernels._src import gpu as tiles
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.matmul import mosaic_gpu
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul import tpu as matmul_tpu
from pallas_kernels._src.ops.matmul.config import Config

#: Dtypes the kernel accepts for x (int4 activations are not supported).
X_DTYPES = frozenset({"float32", "bfloat16", "float16", "int8", "float8_e4m3fn",
                      "float8_e5m2"})
#: Dtypes the kernel accepts for w.
W_DTYPES = X_DTYPES | {"int4"}
#: Dtypes the in-kernel dot runs in.
COMPUTE_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: Dtypes of bias, residual and scale.
EPILOGUE_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: Result dtypes the kernel can store (quantized outputs come via `quantize`).
OUT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float8_e4m3fn",
                        "float8_e5m2"})



def _operand_dtypes_reason(x_dtype, w_dtype) -> str | None:
  """Why x, w or their compute dtype is out of every matmul kernel's reach."""
  xd, wd = tiles.dtype_name(x_dtype), tiles.dtype_name(w_dtype)
  if xd not in X_DTYPES:
    return f"x dtype {xd} {tiles.not_one_of(X_DTYPES)}"
  if wd not in W_DTYPES:
    return f"w dtype {wd} {tiles.not_one_of(W_DTYPES)}"
  cdt = tiles.dtype_name(reference.compute_dtype(x_dtype, w_dtype))
  if cdt not in COMPUTE_DTYPES:
    return f"compute dtype {cdt} {tiles.not_one_of(COMPUTE_DTYPES)}"
  return None


def column_sum_reason(column_sum: bool, w_scale: Any) -> str | None:
  """Why the Triton kernel cannot sum w's columns for this call, or None."""
  if column_sum and w_scale is not None:
    return ("w_column_sum with a w_scale: the kernel sums w's tiles as stored, not "
            "dequantized (the reference sums the scaled w)")
  return None


def dims(x_shape, w_shape, transpose_x: bool, transpose_w: bool) -> tuple[int, int, int]:
  """(M, N, K) of a call from its stored shapes."""
  m, k = (x_shape[-1], x_shape[-2]) if transpose_x else (x_shape[-2], x_shape[-1])
  n = w_shape[-2] if transpose_w else w_shape[-1]
  return int(m), int(n), int(k)


def _sizes(x: Any, w: Any, transpose_x: bool, transpose_w: bool
           ) -> tuple[tuple[int, int, int, int], str | None]:
  """((M, N, K, batch), why the problem is empty or None) of every backend's
  guard."""
  m, n, k = dims(x.shape, w.shape, transpose_x, transpose_w)
  batch = math.prod(jnp.broadcast_shapes(tuple(x.shape[:-2]), tuple(w.shape[:-2])))
  empty = min(m, n, k, batch) == 0
  return (m, n, k, batch), (
      f"empty dimension (M={m}, N={n}, K={k}, batch={batch})" if empty else None)


def unsupported_reason(x: Any, w: Any, *, out_dtype, bias: Any = None,
                       residual: Any = None, scale: Any = None,
                       group_size: int | None = None, quantize: str | None = None,
                       transpose_x: bool = False, transpose_w: bool = False,
                       backend: backend_lib.Backend, interpret: bool,
                       config: Config, column_sum: bool = False,
                       w_scale: Any = None, preactivation: Any = None) -> str | None:
  """Why the forward kernel cannot run this (validated) call, or None.

  Args:
    x, w: the operands (arrays or anything with .shape and .dtype).
    out_dtype: the result dtype (ignored with `quantize`).
    bias, residual, scale: the optional epilogue operands.
    group_size: K-group length of per-group w scales, if any.
    quantize: the quantizing epilogue, if any.
    transpose_x, transpose_w: storage orientation of the operands.
    backend: the backend the call runs on.
    interpret: whether Pallas would interpret the kernel.
    config: the tiling that would be used.
    column_sum: the column sums of w are asked (`w_column_sum`).
    w_scale: w's dequantization scale, if any.
    preactivation: the array `activation_grad` reads, if any.

  Returns:
    A short human-readable reason, or None when the kernel can run.
  """
  reason = gpu.unavailable_reason(interpret)
  if reason:
    return reason
  reason = column_sum_reason(column_sum, w_scale)
  if reason:
    return reason
  xd, wd = tiles.dtype_name(x.dtype), tiles.dtype_name(w.dtype)
  reason = _operand_dtypes_reason(x.dtype, w.dtype)
  if reason:
    return reason
  cdt = tiles.dtype_name(reference.compute_dtype(x.dtype, w.dtype))
  for label, a in (("bias", bias), ("residual", residual), ("scale", scale),
                   ("preactivation", preactivation)):
    if a is not None and tiles.dtype_name(a.dtype) not in EPILOGUE_DTYPES:
      return f"{label} dtype {tiles.dtype_name(a.dtype)} {tiles.not_one_of(EPILOGUE_DTYPES)}"
  if quantize is None and tiles.dtype_name(out_dtype) not in OUT_DTYPES:
    return f"out_dtype {tiles.dtype_name(out_dtype)} {tiles.not_one_of(OUT_DTYPES)}"
  fp8 = {xd, wd, tiles.dtype_name(out_dtype) if quantize is None else quantize}
  if "float8_e4m3fn" in fp8:
    reason = gpu.float8_reason(interpret)
    if reason:
      return reason

  (m, n, k, batch), reason = _sizes(x, w, transpose_x, transpose_w)
  if reason:
    return reason
  for label, a in (("x", x), ("w", w), ("residual", residual),
                   ("preactivation", preactivation)):
    if a is not None and math.prod(a.shape) > tiles.MAX_ELEMENTS:
      return f"{label} has more than 2**31-1 elements (int32 offsets)"
  if batch * m * n > tiles.MAX_ELEMENTS:
    return "the result has more than 2**31-1 elements (int32 offsets)"

  if group_size is not None:
    if k % group_size:
      return f"w_group_size {group_size} does not divide K={k}"
    if group_size % config.block_k:
      return (f"block_k {config.block_k} does not divide w_group_size {group_size} "
              "(each K step must lie in one group)")

  grid = batch * -(-m // config.block_m) * -(-n // config.block_n)
  if grid > tiles.MAX_ELEMENTS:
    return f"grid of {grid} programs exceeds 2**31-1"

  if not interpret and backend is backend_lib.Backend.GPU:
    lo = config_lib.GPU_MIN_BLOCK
    if min(config.block_m, config.block_n, config.block_k) < lo:
      return f"Triton dots need tiles >= {lo}, got {config}"
    if wd == "int4" and not transpose_w and n % config.block_n:
      return (f"int4 w is loaded packed along N, which cannot be masked: N={n} is "
              f"not a multiple of block_n={config.block_n}")
    smem = gpu.pipeline_smem_bytes(
        config.block_m, config.block_n, config.block_k, jnp.dtype(x.dtype).itemsize,
        0.5 if wd == "int4" else jnp.dtype(w.dtype).itemsize, config.num_stages,
        compute_itemsize=jnp.dtype(cdt).itemsize)
    limit = gpu.shared_memory_bytes()
    if smem > limit:
      return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
              f"{limit // 1024} KiB available")
  return None


# --------------------------------------------------------------------------
# The Mosaic GPU (Hopper) kernel.
# --------------------------------------------------------------------------

#: Compute capability whose wgmma the Mosaic GPU kernel is written for.
MOSAIC_CAPABILITY = 90
#: TMA moves rows whose length in bytes is a multiple of this.
TMA_ROW_BYTES = 16


def _row_bytes_reason(label: str, shape, dtype) -> str | None:
  bits = 4 if jnp.dtype(dtype).name == "int4" else 8 * jnp.dtype(dtype).itemsize
  row = shape[-1] * bits
  if row % (8 * TMA_ROW_BYTES):
    return (f"{label} {jnp.dtype(dtype).name}{list(shape)}: TMA copies rows of a multiple of "
            f"{TMA_ROW_BYTES} bytes, a row here is {row / 8:g} bytes")
  return None


def mosaic_unsupported_reason(x: Any, w: Any, *, out_dtype, bias: Any = None,
                              residual: Any = None, scale: Any = None,
                              group_size: int | None = None, quantize: str | None = None,
                              transpose_x: bool = False, transpose_w: bool = False,
                              transpose_out: bool = False, precision: str = "DEFAULT",
                              save_aux_dtype=None, col_vectors: int = 3,
                              row_scale: bool = True, interpret: bool,
                              config: config_lib.MosaicConfig,
                              column_sum: bool = False,
                              activation_grad: bool = False) -> str | None:
  """Why the Mosaic GPU kernel cannot run this (validated) call, or None.

  Args:
    x, w, out_dtype, bias, residual, scale, group_size, quantize,
      transpose_x, transpose_w: as `unsupported_reason`.
    transpose_out: the result is stored transposed.
    precision: `jax.lax.Precision` name of float32 products.
    save_aux_dtype: the dtype of the pre-epilogue accumulator the backward
      saves (None: not saved).
    col_vectors, row_scale: the epilogue's column vectors (w's scales, scale,
      bias) and whether x has per-row scales (for the shared memory count).
    interpret: Mosaic GPU's interpret mode (then any target may run it).
    config: the tiling that would be used.
    column_sum: the column sums of w are asked (`w_column_sum`).
    activation_grad: the epilogue multiplies by an activation's derivative
      at a preactivation array (`activation_grad`).

  Returns:
    A short reason naming the shape or dtype, or None when the kernel runs.
  """
  reason = compat.mosaic_gpu_unavailable_reason()
  if reason:
    return reason
  if column_sum:
    return ("w_column_sum: the Mosaic GPU matmul emits no column sums of w (wgmma reads "
            "the w tiles from shared memory; the Triton kernel sums them as it loads them)")
  if activation_grad:
    return ("activation_grad: the Mosaic GPU matmul's epilogue reads no preactivation "
            "(TMA brings it the residual only); the Triton kernel loads z's tile beside "
            "the residual's")
  target = backend_lib.target()
  if not interpret:
    if target.backend is not backend_lib.Backend.GPU:
      return f"no compiled Mosaic GPU kernel for backend {target.backend.value!r}"
    if target.compute_capability != MOSAIC_CAPABILITY:
      return (f"the Mosaic GPU matmul is built on sm_90a's wgmma; {target.device_kind} is "
              f"sm_{target.compute_capability}")
  xd, wd = tiles.dtype_name(x.dtype), tiles.dtype_name(w.dtype)
  reason = _operand_dtypes_reason(x.dtype, w.dtype)
  if reason:
    return reason
  cdt = tiles.dtype_name(reference.compute_dtype(x.dtype, w.dtype))
  if cdt == "float32" and precision == "HIGHEST":
    return ("float32 at Precision.HIGHEST: wgmma multiplies float32 as TF32 only "
            "(the Triton kernel's FMA path computes IEEE float32)")
  for label, a in (("bias", bias), ("residual", residual), ("scale", scale)):
    if a is not None and tiles.dtype_name(a.dtype) not in EPILOGUE_DTYPES:
      return f"{label} dtype {tiles.dtype_name(a.dtype)} {tiles.not_one_of(EPILOGUE_DTYPES)}"
  odt = quantize or tiles.dtype_name(out_dtype)
  if quantize is None and odt not in OUT_DTYPES:
    return f"out_dtype {odt} {tiles.not_one_of(OUT_DTYPES)}"
  if transpose_out:
    return "transpose_out: the Mosaic GPU matmul stores row-major tiles"
  if cdt == "float32" and (transpose_x or not transpose_w):
    return ("TF32 wgmma reads K-major operands only: float32 x must be stored [M, K] and "
            "w [N, K] (transpose_w); Mosaic GPU cannot transpose a float32 tile in "
            "shared memory")
  paths = config_lib.mosaic_operand_paths(x.dtype, w.dtype, cdt, transpose_x, transpose_w)
  if paths.x_staged and paths.w_staged:
    return (f"x {xd} and w {wd} would both be converted beside the accumulator, which "
            "spills registers; a K-major pair of one 8-bit kind (w stored [N, K], "
            "transpose_w) runs on wgmma as stored")

  (m, n, k, batch), reason = _sizes(x, w, transpose_x, transpose_w)
  if reason:
    return reason
  for label, shape, dt in (("x", x.shape, x.dtype), ("w", w.shape, w.dtype),
                           ("the result", (m, n), odt),
                           ("residual", None if residual is None else residual.shape,
                            None if residual is None else residual.dtype),
                           ("aux", (m, n), save_aux_dtype)):
    if shape is not None and dt is not None:
      reason = _row_bytes_reason(label, shape, dt)
      if reason:
        return reason
  reason = mosaic_gpu.tma_shape_reason(mosaic_gpu.shape_plan(
      x.shape, w.shape, x_dtype=x.dtype, w_dtype=w.dtype, compute_dtype=cdt, out_dtype=odt,
      residual_dtype=None if residual is None else residual.dtype,
      aux_dtype=save_aux_dtype, transpose_x=transpose_x, transpose_w=transpose_w,
      quantize=quantize, cfg=config))
  if reason:
    return reason
  if group_size is not None:
    if k % group_size:
      return f"w_group_size {group_size} does not divide K={k}"
    if group_size % config.tile_k:
      return (f"tile_k {config.tile_k} does not divide w_group_size {group_size} "
              "(each K step must lie in one group)")
  if quantize is not None and config.wg_dimension == "n" and n > config.tile_n:
    return (f"a fused per-row quantization needs each warpgroup's tile to span the row: "
            f"N={n} > tile_n={config.tile_n} with warpgroups along N")
  smem = config_lib.mosaic_smem_bytes(
      config, x_dtype=x.dtype, w_dtype=w.dtype, compute_dtype=cdt, out_dtype=odt,
      residual_dtype=None if residual is None else residual.dtype, aux_dtype=save_aux_dtype,
      col_vectors=col_vectors, row_scale=row_scale, quantize=quantize is not None,
      group_size=group_size, transpose_x=transpose_x, transpose_w=transpose_w)
  limit = gpu.shared_memory_bytes_of(target.device_kind if not interpret else "H100")
  if smem > limit:
    return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
            f"{limit // 1024} KiB available")
  return None


# --------------------------------------------------------------------------
# The Mosaic TPU kernel.
# --------------------------------------------------------------------------


def tpu_unsupported_reason(x: Any, w: Any, *, out_dtype, bias: Any = None,
                           residual: Any = None, scale: Any = None, x_scale: Any = None,
                           w_scale: Any = None, quantize: str | None = None,
                           column_sum: bool = False, transpose_x: bool = False,
                           transpose_w: bool = False, transpose_out: bool = False,
                           aux_dtype=None,
                           requested: tuple[int, int, int] | None = None,
                           preactivation: Any = None) -> str | None:
  """Why the Mosaic TPU kernel (`tpu.py`) cannot run this (validated) call, or None.

  Ragged shapes are not reasons: M and N edges are padded blocks whose extra
  rows and columns are never stored, and K is zero-padded to whole blocks.

  Args:
    x, w, out_dtype, bias, residual, scale, quantize, transpose_x,
      transpose_w, transpose_out: as `mosaic_unsupported_reason`.
    x_scale, w_scale: the dequantization scales, if any.
    column_sum: the column sums of w are asked (`w_column_sum`).
    aux_dtype: dtype of the pre-epilogue accumulator the backward saves, or
      None (it takes VMEM beside the output block).
    requested: a caller's `Config` (block_m, block_n, block_k), or None.
    preactivation: the array `activation_grad` reads, if any.
  """
  if quantize is not None:
    return (f"quantize={quantize!r} has no TPU kernel (the TPU matmul fuses scale, bias, "
            "activation or its derivative, residual, clamp and the output cast only)")
  if column_sum:
    return "w_column_sum: the TPU matmul emits no column sums of w"
  if x_scale is not None or w_scale is not None or reference.is_quantized(
      x.dtype) or reference.is_quantized(w.dtype):
    return (f"quantized operands or dequantization scales (x {tiles.dtype_name(x.dtype)}, w "
            f"{tiles.dtype_name(w.dtype)}): the dequantizing prologue has no TPU kernel")
  reason = tpu_lib.dtype_reason([a.dtype for a in (x, w, bias, residual, scale, preactivation)
                                 if a is not None] + [out_dtype])
  if reason:
    return reason
  (m, n, k, batch), reason = _sizes(x, w, transpose_x, transpose_w)
  if reason:
    return reason
  geo = matmul_tpu.geometry(x.shape, w.shape, transpose_x, transpose_w, transpose_out)
  fp = matmul_tpu.footprint(
      x, w, geo, transpose_x=transpose_x, transpose_w=transpose_w, out_dtype=out_dtype,
      residual_dtype=None if residual is None else residual.dtype, aux_dtype=aux_dtype,
      vectors=(bias is not None) + (scale is not None),
      preactivation_dtype=None if preactivation is None else preactivation.dtype)
  return matmul_tpu.vmem_reason(matmul_tpu.plan(geo, fp, requested), fp)

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
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.matmul import reference
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
#: Pallas' Triton lowering computes element offsets in int32.
MAX_ELEMENTS = 2**31 - 1


def _name(dtype) -> str:
  return jnp.dtype(dtype).name


def dims(x_shape, w_shape, transpose_x: bool, transpose_w: bool) -> tuple[int, int, int]:
  """(M, N, K) of a call from its stored shapes."""
  m, k = (x_shape[-1], x_shape[-2]) if transpose_x else (x_shape[-2], x_shape[-1])
  n = w_shape[-2] if transpose_w else w_shape[-1]
  return int(m), int(n), int(k)


def unsupported_reason(x: Any, w: Any, *, out_dtype, bias: Any = None,
                       residual: Any = None, scale: Any = None,
                       group_size: int | None = None, quantize: str | None = None,
                       transpose_x: bool = False, transpose_w: bool = False,
                       backend: backend_lib.Backend, interpret: bool,
                       config: Config) -> str | None:
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

  Returns:
    A short human-readable reason, or None when the kernel can run.
  """
  reason = gpu.unavailable_reason(interpret)
  if reason:
    return reason
  xd, wd = _name(x.dtype), _name(w.dtype)
  if xd not in X_DTYPES:
    return f"x dtype {xd} is not one of {sorted(X_DTYPES)}"
  if wd not in W_DTYPES:
    return f"w dtype {wd} is not one of {sorted(W_DTYPES)}"
  cdt = _name(reference.compute_dtype(x.dtype, w.dtype))
  if cdt not in COMPUTE_DTYPES:
    return f"compute dtype {cdt} is not one of {sorted(COMPUTE_DTYPES)}"
  for label, a in (("bias", bias), ("residual", residual), ("scale", scale)):
    if a is not None and _name(a.dtype) not in EPILOGUE_DTYPES:
      return f"{label} dtype {_name(a.dtype)} is not one of {sorted(EPILOGUE_DTYPES)}"
  if quantize is None and _name(out_dtype) not in OUT_DTYPES:
    return f"out_dtype {_name(out_dtype)} is not one of {sorted(OUT_DTYPES)}"
  fp8 = {xd, wd, _name(out_dtype) if quantize is None else quantize}
  if "float8_e4m3fn" in fp8:
    reason = gpu.float8_reason(interpret)
    if reason:
      return reason

  m, n, k = dims(x.shape, w.shape, transpose_x, transpose_w)
  batch = math.prod(jnp.broadcast_shapes(tuple(x.shape[:-2]), tuple(w.shape[:-2])))
  if min(m, n, k, batch) == 0:
    return f"empty dimension (M={m}, N={n}, K={k}, batch={batch})"
  for label, a in (("x", x), ("w", w), ("residual", residual)):
    if a is not None and math.prod(a.shape) > MAX_ELEMENTS:
      return f"{label} has more than 2**31-1 elements (int32 offsets)"
  if batch * m * n > MAX_ELEMENTS:
    return "the result has more than 2**31-1 elements (int32 offsets)"

  if group_size is not None:
    if k % group_size:
      return f"w_group_size {group_size} does not divide K={k}"
    if group_size % config.block_k:
      return (f"block_k {config.block_k} does not divide w_group_size {group_size} "
              "(each K step must lie in one group)")

  grid = batch * -(-m // config.block_m) * -(-n // config.block_n)
  if grid > MAX_ELEMENTS:
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

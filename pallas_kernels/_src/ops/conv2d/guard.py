"""When the conv2d kernel cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a user's program never breaks.
Invalid calls (mismatched shapes, an unknown activation) raise ValueError in
`api.py` instead.

No channel count is too large: the kernel walks C/G in `block_c` steps and F
in `block_f` tiles, so its registers and shared memory depend on the tiling
only (checked below against the device), never on C or F. The window is a
loop too. What does bound it: int32 element offsets, and Triton's dot tiles.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.conv2d import config as config_lib
from pallas_kernels._src.ops.conv2d.config import Config
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu

#: dtypes of every array argument and the result the kernel is written and
#: validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: The kernel computes pixel and channel offsets in int32 (Triton's default
#: offset type, and our index arrays).




def unsupported_reason(x: Any, w: Any, *, scale: Any = None, shift: Any = None,
                       bias: Any = None, residual: Any = None, out_dtype, groups: int,
                       out_hw: tuple[int, int], interpret: bool,
                       config: Config) -> str | None:
  """Why the kernel cannot run this (validated) call, or None if it can.

  Args:
    x: [N, H, W, C] (an array or anything with .shape and .dtype).
    w: [KH, KW, C/groups, F].
    scale, shift: [C] or None; bias: [F] or None; residual: [N, HO, WO, F] or None.
    out_dtype: the result dtype.
    groups: the feature group count.
    out_hw: (HO, WO).
    interpret: whether Pallas would interpret the kernel.
    config: the tiling that would be used.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("w", w), ("scale", scale), ("shift", shift), ("bias", bias),
            ("residual", residual))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, SUPPORTED_DTYPES)
  if reason:
    return reason
  if gpu.dtype_name(w.dtype) != gpu.dtype_name(x.dtype):
    # Both dot operands must share an element type (Triton's tt.dot).
    return (f"mismatched dtypes: {gpu.describe('x', x)} with {gpu.describe('w', w)}; "
            "cast them to one dtype")
  if gpu.dtype_name(out_dtype) not in SUPPORTED_DTYPES:
    return f"out_dtype {gpu.dtype_name(out_dtype)} {gpu.not_one_of(SUPPORTED_DTYPES)}"

  n, h, wd, c = (int(d) for d in x.shape)
  kh, kw, _, f = (int(d) for d in w.shape)
  ho, wo = out_hw
  if min(n, h, wd, c, f, ho, wo) == 0:
    return f"empty dimension of {gpu.describe('x', x)}, {gpu.describe('w', w)} -> [{ho}, {wo}]"
  for label, count in (("x", n * h * wd * c), ("w", kh * kw * (c // groups) * f),
                       ("the result", n * ho * wo * f)):
    if count > gpu.MAX_ELEMENTS:
      return f"{label} has {count} > 2**31-1 elements (int32 offsets)"

  if not interpret and backend_lib.current_backend() is backend_lib.Backend.GPU:
    depthwise = c // groups == 1
    if not depthwise:
      lo = config_lib.GPU_MIN_BLOCK
      if min(config.block_p, config.block_f, config.block_c) < lo:
        return f"Triton dots need tiles >= {lo}, got {config}"
    smem = config_lib.smem_bytes(config, jnp.dtype(x.dtype).itemsize, depthwise)
    limit = matmul_gpu.shared_memory_bytes()
    if smem > limit:
      return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
              f"{limit // 1024} KiB available")
  return None

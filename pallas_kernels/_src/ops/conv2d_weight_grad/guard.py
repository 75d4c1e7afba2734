"""When the weight-gradient kernel cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a user's program never breaks.
Invalid calls (shapes that do not fit the convolution, malformed windows)
raise ValueError in `api.py` instead.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.conv2d_weight_grad import config as config_lib
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.ops.conv2d_weight_grad.reference import Window
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu

#: dtypes of x, dy and the result the kernel is written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: CUDA's limit on a grid's second and third dimensions, where the kernel
#: puts taps x groups x C tiles and the F tiles (the splits go on the first,
#: which takes 2**31 - 1).
MAX_GRID_YZ = 65535




def unsupported_reason(x: Any, dy: Any, win: Window, *, out_dtype, interpret: bool,
                       config: Config, state: tuple[Any, Any, Any] | None = None
                       ) -> str | None:
  """Why the kernel cannot run this (validated) call, or None if it can.

  Args:
    x: [N, H, W, C] (an array or anything with .shape and .dtype).
    dy: [N, HO, WO, F].
    win: the convolution's geometry.
    out_dtype: the dtype of dw (not read with `state`: nothing returns dw).
    interpret: whether Pallas would interpret the kernel.
    config: the tiling that would be used.
    state: (param, mu, nu) when Adam's update is the epilogue, else None.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("dy", dy))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, SUPPORTED_DTYPES)
  if reason:
    return reason
  if gpu.dtype_name(x.dtype) != gpu.dtype_name(dy.dtype):
    # Both dot operands must share an element type (Triton's tt.dot).
    return (f"mismatched dtypes: {gpu.describe('x', x)} with {gpu.describe('dy', dy)}; "
            "cast them to one dtype")
  if state is not None:
    reason = adam.state_reason(*state)
    if reason:
      return reason
    if config.splits != 1:
      # No program would hold its tile's whole gradient to update it.
      return (f"the Adam update needs each program to sum every pixel of its tile: "
              f"splits=1, got {config}")
  elif gpu.dtype_name(out_dtype) not in SUPPORTED_DTYPES:
    return f"out_dtype {gpu.dtype_name(out_dtype)} {gpu.not_one_of(SUPPORTED_DTYPES)}"
  if min(x.shape) == 0 or min(dy.shape) == 0:
    return f"empty dimension in {gpu.describe('x', x)} or {gpu.describe('dy', dy)}"

  c = int(x.shape[-1])
  f = int(dy.shape[-1])
  cg, fg = c // win.groups, f // win.groups
  partials = config.splits * win.taps * cg * f
  # Pixel indices run to the last split's last tile, past N*HO*WO.
  tiles = -(-math.prod(dy.shape[:3]) // config.block_p)
  padded = -(-tiles // config.splits) * config.splits * config.block_p
  for label, count in (("x", math.prod(x.shape)), ("dy", math.prod(dy.shape)),
                       (f"the {config.splits} split partials of dw", partials),
                       ("the pixel range padded to whole tiles", padded)):
    if count > gpu.MAX_ELEMENTS:
      return f"{label} has {count} > 2**31-1 elements (int32 offsets)"
  depthwise = cg == 1
  c_tiles = 1 if depthwise else -(-cg // config.block_c)
  f_tiles = -(-(f if depthwise else fg) // config.block_f)
  programs = win.taps * (1 if depthwise else win.groups * c_tiles)
  if programs > MAX_GRID_YZ or f_tiles > MAX_GRID_YZ:
    return (f"grid of {programs} tap x group x C-tile programs by {f_tiles} F tiles "
            f"exceeds CUDA's {MAX_GRID_YZ} (groups={win.groups}, {win.taps} taps, "
            f"{config}); use larger blocks")

  if not interpret and backend_lib.current_backend() is backend_lib.Backend.GPU:
    lo = config_lib.GPU_MIN_BLOCK
    edges = (config.block_p, config.block_f) + (() if depthwise else (config.block_c,))
    if min(edges) < lo:
      return f"Triton dots need tiles >= {lo}, got {config}"
    tile = config_lib.tile_elements(config, depthwise)
    if state is not None and tile > adam.GPU_MAX_TILE:
      return (f"{config} holds four f32 tiles of {tile} elements for the Adam update, "
              f"more than {adam.GPU_MAX_TILE} per program; use smaller blocks")
    smem = config_lib.smem_bytes(config, jnp.dtype(x.dtype).itemsize, depthwise,
                                 update=state is not None)
    limit = matmul_gpu.shared_memory_bytes()
    if smem > limit:
      return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
              f"{limit // 1024} KiB available")
  return None

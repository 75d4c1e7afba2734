"""When the batch-norm kernels cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a user's program never breaks.
Invalid calls (gamma or beta not [C], a bad eps or activation) raise
ValueError in `api.py` instead.
"""

from __future__ import annotations

import math
from typing import Any

from pallas_kernels._src import gpu
from pallas_kernels._src.ops.batch_norm.config import Config

#: dtypes of x, gamma and beta the kernels are written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})


def unsupported_reason(x: Any, gamma: Any, beta: Any, *, interpret: bool,
                       config: Config) -> str | None:
  """Why the kernels cannot run this (validated) call, or None if they can.

  Args:
    x: [..., C] (an array or anything with .shape and .dtype).
    gamma, beta: [C].
    interpret: whether Pallas would interpret the kernels.
    config: the tiling that would be used.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("gamma", gamma), ("beta", beta))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, SUPPORTED_DTYPES)
  if reason:
    return reason
  if len(x.shape) < 2:
    return (f"{gpu.describe('x', x)} has no axis before the channels to take batch "
            "statistics over (the kernels take [..., C] with rank >= 2)")
  if min(x.shape) == 0:
    return f"empty dimension in {gpu.describe('x', x)}"
  m, c = math.prod(x.shape[:-1]), int(x.shape[-1])
  # A split's block reaches past M to whole row tiles.
  padded = config.splits * config.steps(m) * config.block_m * c
  for label, count in (("x", m * c), ("x padded to whole row tiles", padded)):
    if count > gpu.MAX_ELEMENTS:
      return f"{label} has {count} > 2**31-1 elements (int32 offsets)"
  tiles = -(-c // config.block_c)  # the grid's second dimension
  if tiles > gpu.MAX_GRID_Y:
    return (f"C={c} makes {tiles} channel tiles of {config.block_c}, past CUDA's grid "
            f"limit of {gpu.MAX_GRID_Y}; use a larger block_c")
  return None

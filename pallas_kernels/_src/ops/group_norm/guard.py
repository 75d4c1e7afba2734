"""When the group-norm kernels cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a user's program never breaks.
Invalid calls (rank < 2, scale or bias not [C], C not divisible by groups, a
bad epsilon or activation) raise ValueError in `api.py` instead.
"""

from __future__ import annotations

import math
from typing import Any

from pallas_kernels._src import gpu
from pallas_kernels._src.ops.group_norm import config as config_lib
from pallas_kernels._src.ops.group_norm.config import Config
from pallas_kernels._src.ops.tiling import next_pow2

#: dtypes of x, scale and bias the kernels are written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})


def unsupported_reason(x: Any, scale: Any, bias: Any, *, groups: int, interpret: bool,
                       config: Config) -> str | None:
  """Why the kernels cannot run this (validated) call, or None if they can.

  Args:
    x: [N, ..., C] (an array or anything with .shape and .dtype).
    scale, bias: [C].
    groups: channel groups (divides C).
    interpret: whether Pallas would interpret the kernels.
    config: the tiling that would be used.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("scale", scale), ("bias", bias))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, SUPPORTED_DTYPES)
  if reason:
    return reason
  if min(x.shape) == 0:
    return f"empty dimension in {gpu.describe('x', x)}"
  n, c = int(x.shape[0]), int(x.shape[-1])
  r = math.prod(x.shape[1:-1])
  gs = c // groups
  if next_pow2(gs) > config_lib.MAX_BLOCK_C:
    return (f"a group of {gs} channels ({gpu.describe('x', x)}, groups={groups}) is "
            f"wider than the kernels' widest tile of {config_lib.MAX_BLOCK_C} channels")
  per_program = config.groups_per_program(c, groups)
  if per_program < 1:
    return (f"a group of {gs} channels does not fit config.block_c={config.block_c}; "
            f"use block_c >= {next_pow2(gs)}")
  rows, cols = config.padded(r, c, groups)
  for label, count in (("x", n * r * c), ("x padded to whole tiles", n * rows * cols)):
    if count > gpu.MAX_ELEMENTS:
      return f"{label} has {count} > 2**31-1 elements (int32 offsets)"
  windows = -(-groups // per_program)  # the grid's second dimension
  if windows > gpu.MAX_GRID_Y:
    return (f"groups={groups} makes {windows} channel windows of {per_program} groups, "
            f"past CUDA's grid limit of {gpu.MAX_GRID_Y}; use a larger block_c")
  return None

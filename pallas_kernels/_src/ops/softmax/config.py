"""Block sizes for softmax: the only place for those rules.

A program owns `block_rows` rows. A row that fits one `block_cols` chunk is
read once and kept in registers; a longer row is read twice (online max and
sum, then output), the backward likewise (sum(dy * y), then dx).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one softmax kernel launch.

  Attributes:
    block_rows: rows per grid step (a power of two).
    block_cols: columns per chunk (a power of two; Triton tensors must be).
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages (GPU only).
  """

  block_rows: int
  block_cols: int
  num_warps: int = 4
  num_stages: int = 1

  def __post_init__(self):
    for name in ("block_rows", "block_cols", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value}")
    if self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be >= 1: {self}")


#: float32 elements one program holds per chunk. GPU: 8K over up to 16 warps
#: (16 per thread). Interpret mode pays per grid step, so it takes big blocks.
_TILE_ELEMENTS = {
    backend_lib.Backend.GPU: 8192,
    backend_lib.Backend.TPU: 8192,
    backend_lib.Backend.CPU: 1 << 16,
}
#: Widest chunk; longer rows are walked in chunks (online softmax).
_MAX_BLOCK_COLS = 8192
_MAX_BLOCK_ROWS = 64


def heuristic_config(shape: tuple[int, ...], dtype, backend: backend_lib.Backend
                     ) -> Config:
  """Tiling for a softmax over the last axis of `shape`.

  Args:
    shape: full input shape; leading dims are flattened into rows.
    dtype: input dtype (registers hold float32 whatever it is; kept for
      interface symmetry with the other ops).
    backend: where the kernel runs (CPU means interpret mode).
  """
  del dtype
  n_cols = int(shape[-1])
  n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
  block_cols = min(next_pow2(n_cols), _MAX_BLOCK_COLS)
  # All three bounds are powers of two, so their minimum is one too.
  block_rows = max(1, min(_MAX_BLOCK_ROWS, _TILE_ELEMENTS[backend] // block_cols,
                          next_pow2(n_rows)))
  tile = block_rows * block_cols
  num_warps = int(min(16, max(1, next_pow2(tile // (32 * 16)))))
  return Config(block_rows=block_rows, block_cols=block_cols,
                num_warps=num_warps, num_stages=1)


def heuristic_backward_config(shape: tuple[int, ...], dtype,
                              backend: backend_lib.Backend) -> Config:
  """Backward tiling: it streams y and dy (two inputs), so half the rows."""
  fwd = heuristic_config(shape, dtype, backend)
  return dataclasses.replace(fwd, block_rows=max(1, fwd.block_rows // 2))

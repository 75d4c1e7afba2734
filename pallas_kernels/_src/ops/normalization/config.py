"""Block sizes for layer norm and RMS norm: the only place for those rules.

A kernel instance owns `block_rows` full rows and walks them in chunks of
`block_cols` columns. When a row fits one chunk it is read once (forward) and
kept in registers; a longer row is read twice (statistics, then output), three
times with a quantizing epilogue (its scale needs the row's max first).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one row-wise kernel launch.

  Attributes:
    block_rows: rows per grid step (a power of two).
    block_cols: columns per chunk (a power of two; Triton tensors must be).
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages (GPU only).
    row_steps: backward only: consecutive row blocks one program walks, so that
      the per-program dgamma/dbeta partial sums stay few. Must be 1 when a row
      needs more than one column chunk (partials then live per chunk).
  """

  block_rows: int
  block_cols: int
  num_warps: int = 4
  num_stages: int = 1
  row_steps: int = 1

  def __post_init__(self):
    for name in ("block_rows", "block_cols", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value}")
    if self.num_stages < 1 or self.row_steps < 1:
      raise ValueError(f"Config.num_stages and row_steps must be >= 1: {self}")

  @property
  def rows_per_program(self) -> int:
    return self.block_rows * self.row_steps


#: Elements (f32 registers) one program holds per chunk, by backend. GPU: 8K
#: floats over up to 16 warps is 16 per thread, well inside the register file.
#: Interpret mode pays per grid step, not per element, so it takes big blocks.
_TILE_ELEMENTS = {
    backend_lib.Backend.GPU: 8192,
    backend_lib.Backend.TPU: 8192,
    backend_lib.Backend.CPU: 1 << 16,
}
#: Widest chunk: longer rows are walked in chunks of this many columns.
_MAX_BLOCK_COLS = 8192
#: Most rows per program (more only adds registers, not bandwidth).
_MAX_BLOCK_ROWS = 64
#: Backward: aim for about this many programs, each summing its own partial
#: dgamma/dbeta rows (more programs fill the GPU, fewer keep the partials small).
_BWD_TARGET_PROGRAMS = 512


def _warps(tile_elements: int) -> int:
  # About 16 elements per thread, 1 to 16 warps of 32 threads.
  return int(min(16, max(1, next_pow2(tile_elements // (32 * 16)))))


def heuristic_config(shape: tuple[int, ...], dtype, backend: backend_lib.Backend
                     ) -> Config:
  """Forward tiling for normalizing `shape` (last axis) of `dtype`.

  Args:
    shape: full input shape; leading dims are flattened into rows.
    dtype: input dtype (bytes per element do not change the f32 register
      budget, so it is accepted for interface symmetry and future rules).
    backend: where the kernel runs.
  """
  del dtype
  n_cols = int(shape[-1])
  n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
  budget = _TILE_ELEMENTS[backend]
  block_cols = min(next_pow2(n_cols), _MAX_BLOCK_COLS)
  # All three bounds are powers of two, so their minimum is one too.
  block_rows = max(1, min(_MAX_BLOCK_ROWS, budget // block_cols,
                          next_pow2(n_rows)))
  return Config(block_rows=block_rows, block_cols=block_cols,
                num_warps=_warps(block_rows * block_cols), num_stages=1)


def heuristic_backward_config(shape: tuple[int, ...], dtype,
                              backend: backend_lib.Backend) -> Config:
  """Backward tiling: the forward tile plus `row_steps` for partial sums."""
  fwd = heuristic_config(shape, dtype, backend)
  n_cols = int(shape[-1])
  n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
  if n_cols > fwd.block_cols:
    return fwd  # Chunked rows: partials per program and chunk, row_steps 1.
  blocks = -(-n_rows // fwd.block_rows)
  steps = max(1, -(-blocks // _BWD_TARGET_PROGRAMS))
  if backend is backend_lib.Backend.CPU:
    steps = blocks  # Interpret mode: one program; loops are cheaper than steps.
  return dataclasses.replace(fwd, row_steps=max(1, steps))

"""TPU (Mosaic-lowered Pallas) facts shared by the row-wise ops and the matmul.

The row kernels on a TPU take a block of whole rows per grid step: the row
block is a multiple of the sublane tile (8 rows of 32-bit values, 16 of
16-bit, 32 of 8-bit) or the whole row count, and a row is one block wide
(the array's full last dimension, which Mosaic lays out in lanes padded to a
multiple of 128). A ragged last row block is padded by Pallas: its rows past
the end are never written back, and a kernel that reduces over rows must
select them away itself.

Nothing here claims a speed: these kernels have been validated in TPU
interpret mode and compiled for v5e and v6e, never run on a TPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels._src import backend

#: The Pallas backend the TPU kernels lower through (`validate`'s column).
KERNEL_BACKEND = "mosaic_tpu"
#: VMEM one kernel may plan for: its double-buffered blocks plus its float32
#: temporaries. 16 MiB is the smallest default scoped-VMEM limit of the TPU
#: generations (v4, v5e; v6e's is 32 MiB), so no compiler flag is needed.
VMEM_BUDGET_BYTES = 16 * 2**20
#: Lanes of a vreg: a row's VMEM footprint is its width rounded up to these.
LANES = 128
#: Rows of 32-bit values in one vreg tile; narrower dtypes pack more.
SUBLANES = 8
#: Most rows per block: memory-bound row ops gain nothing from bigger blocks
#: (a 1024-row block of 128 float32 lanes is already 512 KiB per array).
MAX_BLOCK_ROWS = 1024
#: Input dtypes the TPU row kernels are written and validated for (float16
#: has no VPU support on v5e and earlier).
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16"})
#: Blocks in flight per array: Pallas double-buffers each input and output.
BUFFERS = 2


def is_target() -> bool:
  """Whether the op being built targets a TPU (compiled or interpreted)."""
  return backend.current_backend() is backend.Backend.TPU


def bytes_moved(inputs, out_shape) -> int:
  """Bytes a kernel that reads each input and writes each output once moves
  (its `pl.CostEstimate`'s `bytes_accessed`)."""
  return sum(a.size * jnp.dtype(a.dtype).itemsize for a in (*inputs, *out_shape))


def padded_lanes(n_cols: int) -> int:
  """A row's width in VMEM: `n_cols` rounded up to whole lanes."""
  return -(-n_cols // LANES) * LANES


def row_multiple(dtypes: Iterable[Any]) -> int:
  """Rows of a block of these dtypes that fill whole sublane tiles."""
  narrowest = min((jnp.dtype(d).itemsize for d in dtypes), default=4)
  return SUBLANES * max(1, 4 // narrowest)


def tile_bytes(rows: int, cols: int, dtype: Any) -> int:
  """VMEM one [rows, cols] block of `dtype` takes: rows rounded up to whole
  sublane tiles, columns to whole lanes."""
  multiple = row_multiple([dtype])
  return (-(-rows // multiple) * multiple) * padded_lanes(cols) * jnp.dtype(dtype).itemsize


def row_bytes(n_cols: int, io_itemsizes: Iterable[int], f32_temps: int) -> int:
  """VMEM one row of a block takes: every input and output row,
  double-buffered, plus `f32_temps` float32 rows of temporaries."""
  return padded_lanes(n_cols) * (BUFFERS * sum(io_itemsizes) + 4 * f32_temps)


def block_rows(n_rows: int, n_cols: int, per_row: int, multiple: int,
               requested: int | None = None) -> tuple[int, str | None]:
  """(rows per block, why no block fits the VMEM budget or None).

  Args:
    n_rows: rows of the (flattened) array.
    n_cols: its width (for the reason's words).
    per_row: `row_bytes` of one row.
    multiple: `row_multiple` of the block's dtypes.
    requested: the caller's `Config.block_rows`, rounded up to `multiple`
      (a GPU config's 1 or 2 rows mean nothing to a TPU); None: the most
      rows the budget fits, up to `MAX_BLOCK_ROWS`.
  """
  budget = VMEM_BUDGET_BYTES
  if requested is not None:
    bm = -(-requested // multiple) * multiple
  else:
    bm = min(budget // per_row, MAX_BLOCK_ROWS) // multiple * multiple
    if bm == 0:
      bm = multiple
  if n_rows <= bm:
    bm = n_rows  # One block of every row: a full dimension needs no tiling.
  need = bm * per_row
  if need > budget:
    return bm, (f"a block of {bm} rows of width {n_cols} ({padded_lanes(n_cols)} "
                f"lanes) needs {need / 2**20:.1f} MiB of VMEM, over the "
                f"{budget // 2**20} MiB budget of a TPU kernel")
  return bm, None


def dtype_reason(dtypes: Iterable[Any]) -> str | None:
  """Why a TPU row kernel cannot take these dtypes, or None."""
  for dt in dtypes:
    name = jnp.dtype(dt).name
    if name not in SUPPORTED_DTYPES:
      return f"dtype {name} has no TPU kernel (TPU kernels take {sorted(SUPPORTED_DTYPES)})"
  return None


def interpret_params(interpret: bool) -> Any:
  """`pallas_call(interpret=...)` for a TPU kernel: TPU interpret mode (Mosaic
  semantics on this CPU; uninitialized memory is NaN, so an unselected
  padded row shows up in tests) or False (compile)."""
  return pltpu.InterpretParams() if interpret else False


def compiler_params(grid_dims: int, *, sequential: int = 0, fusible_inputs: int = 0) -> Any:
  """Mosaic params: the leading grid axes independent (megacore may split
  them), the last `sequential` ones "arbitrary": run in order on one core,
  as a reduction carried in scratch across them needs. The first
  `fusible_inputs` inputs may take their producer (a pad, a layout copy, an
  elementwise op) into the kernel's input DMA instead of a separate XLA
  launch that materializes it; XLA decides whether to."""
  return pltpu.CompilerParams(
      dimension_semantics=("parallel",) * (grid_dims - sequential) + ("arbitrary",) * sequential,
      allow_input_fusion=[True] * fusible_inputs if fusible_inputs else None)

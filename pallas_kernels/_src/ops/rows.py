"""Helpers shared by the row-wise kernels (norms, softmax).

Row-wise kernels see a 2-D array [rows, cols]: a grid over blocks of
`block_rows` rows (BlockSpecs over rows, full width), and inside a block a walk
over the columns in chunks of `block_cols` (a power of two, as Triton needs).
Every access goes through a mask, so neither a ragged last row block nor a row
width that is not a multiple of `block_cols` is ever read or written past its
end.

A block is `padded_cols` wide (the width rounded up to whole chunks), as the
matmul kernels round K up to whole K steps: every chunk's slice then lies
inside the block, which JAX >= 0.12 checks for static slices at trace time,
while the masks keep every access inside the array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import gpu


def row_ids(block_index, block_rows: int):
  """Global row indices [block_rows] of row block `block_index`."""
  return block_index * block_rows + jnp.arange(block_rows, dtype=jnp.int32)


def col_ids(start, block_cols: int):
  """Column indices [block_cols] of the chunk starting at `start`."""
  return start + jnp.arange(block_cols, dtype=jnp.int32)


def num_chunks(n_cols: int, block_cols: int) -> int:
  """How many column chunks cover a row (static)."""
  return pl.cdiv(n_cols, block_cols)


def padded_cols(n_cols: int, block_cols: int) -> int:
  """Width of a row block's BlockSpec: `n_cols` rounded up to whole chunks."""
  return num_chunks(n_cols, block_cols) * block_cols


def over_chunks(n_chunks: int, block_cols: int, body: Callable[[Any, Any], Any],
                init: Any) -> Any:
  """Folds `body(col_start, carry)` over the column chunks.

  A single chunk is traced straight-line with a static start of 0, so the
  common case (row fits one block) has no loop at all.
  """
  if n_chunks == 1:
    return body(0, init)

  def step(c, carry):
    return body(pl.multiple_of(c * block_cols, block_cols), carry)

  return jax.lax.fori_loop(0, n_chunks, step, init)


def _past_end_ok(start, size: int, length: int):
  """`start`, traced if a static `start` would reach past `length`.

  JAX 0.12 rejects a statically known slice that runs past a ref's end at
  trace time, masked or not; a traced start of the same value is not checked,
  and the mask still keeps every access in bounds (Triton folds the zero).
  """
  if isinstance(start, int) and start + size > length:
    return pl.program_id(0) * 0 + start
  return start


def load_tile(ref, local_row0, col0, block_rows: int, block_cols: int, mask,
              other=0.0):
  """Masked load of a [block_rows, block_cols] tile of a 2-D block ref."""
  local_row0 = _past_end_ok(local_row0, block_rows, ref.shape[0])
  col0 = _past_end_ok(col0, block_cols, ref.shape[1])
  view = ref.at[pl.ds(local_row0, block_rows), pl.ds(col0, block_cols)]
  return gpu.load(view, mask, other)


def store_tile(ref, local_row0, col0, block_rows: int, block_cols: int, value,
               mask) -> None:
  """Masked store of a [block_rows, block_cols] tile into a 2-D block ref."""
  local_row0 = _past_end_ok(local_row0, block_rows, ref.shape[0])
  col0 = _past_end_ok(col0, block_cols, ref.shape[1])
  view = ref.at[pl.ds(local_row0, block_rows), pl.ds(col0, block_cols)]
  gpu.store(view, value, mask)


def load_vec(ref, start, size: int, mask, other=0.0):
  """Masked load of `size` consecutive entries of a 1-D ref."""
  start = _past_end_ok(start, size, ref.shape[0])
  return gpu.load(ref.at[pl.ds(start, size)], mask, other)


def store_vec(ref, start, size: int, value, mask) -> None:
  """Masked store of `size` consecutive entries into a 1-D ref."""
  start = _past_end_ok(start, size, ref.shape[0])
  gpu.store(ref.at[pl.ds(start, size)], value, mask)


def flatten_rows(x) -> tuple[Any, tuple[int, ...]]:
  """[..., n] -> ([rows, n], leading shape); a 1-D x is one row."""
  lead = tuple(x.shape[:-1])
  rows = 1
  for d in lead:
    rows *= d
  return x.reshape(rows, x.shape[-1]), lead


#: Rows a row-wise kernel can index (its grid and offsets are int32).
MAX_ROWS = 2**31 - 1


def rows_reason(x_shape) -> str | None:
  """Why a row-wise kernel cannot take an array of `x_shape` (its rows are
  all leading dimensions), or None."""
  rows = 1
  for d in x_shape[:-1]:
    rows *= d
  if rows == 0:
    return "x has no rows"
  if rows > MAX_ROWS:
    return f"{rows} rows exceed the kernel's int32 row index"
  return None

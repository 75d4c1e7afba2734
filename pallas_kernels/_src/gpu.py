"""GPU (Triton-lowered Pallas) specifics shared by the row-wise ops.

Decision: JAX 0.11 deprecated Pallas's Triton lowering in favour of Mosaic GPU.
We still compile through `pallas_call` with Triton compiler params because that
one kernel runs on A100, H100 and H200 alike (Mosaic GPU targets Hopper and
newer), and the same body runs in interpret mode on CPU for tests. Everything
Triton-specific lives in this module, so a Mosaic GPU implementation for Hopper
can sit beside it without touching the ops' math.

The Triton lowering neither bounds-checks nor pads blocks: a load or store past
the end of an array touches foreign memory. The kernels therefore read and write
only through `load` and `store` below, always with a mask. Interpret mode pads
blocks with NaN instead, so an unmasked access shows up there as NaN in tests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend
from pallas_kernels._src import compat

# Deprecated since JAX 0.11 and slated for removal: None when it is gone, and
# then the ops fall back to XLA (see `unavailable_reason`).
_plgpu = compat.pallas_triton


def unavailable_reason(interpret: bool) -> str | None:
  """Why a row-wise Pallas kernel cannot run here, or None if it can.

  Args:
    interpret: whether the kernel would run in interpret mode.
  """
  if _plgpu is None:
    return "jax.experimental.pallas.triton is missing from this JAX version"
  if interpret:
    return None
  kind = backend.current_backend()
  if kind is not backend.Backend.GPU:
    # TPU (Mosaic) needs (8, 128)-aligned blocks and has no masked loads.
    return f"no compiled row-wise kernel for backend {kind.value!r}"
  return None


def compute_capability() -> int | None:
  """Compute capability of the target GPU as an int (90 for H100), else None."""
  t = backend.target()
  return t.compute_capability if t.backend is backend.Backend.GPU else None


def float8_reason(interpret: bool) -> str | None:
  """Why float8 conversions cannot be compiled here (Triton needs sm_89+)."""
  if interpret:
    return None
  cc = compute_capability()
  if cc is not None and cc < 89:
    return f"float8_e4m3fn conversion needs compute capability >= 8.9, got {cc}"
  return None


def compiler_params(*, num_warps: int, num_stages: int) -> Any:
  """Triton compiler params for `pallas_call` (not for interpret mode)."""
  return compat.triton_compiler_params(num_warps=num_warps, num_stages=num_stages)


def load(ref: Any, mask: Any, other: float | int) -> Any:
  """Masked load: `ref[...]` where `mask` holds, `other` elsewhere."""
  return _plgpu.load(ref, mask=mask, other=other)


def store(ref: Any, value: Any, mask: Any) -> None:
  """Masked store: writes `value` into `ref` only where `mask` holds."""
  _plgpu.store(ref, value.astype(ref.dtype), mask=mask)


#: Shared memory one block may use (the opt-in maximum), bytes, by compute
#: capability major * 10 + minor: the CUDA C++ Programming Guide, "Technical
#: Specifications per Compute Capability".
SHARED_MEMORY_PER_BLOCK = {
    70: 96 * 1024, 75: 64 * 1024,                                       # V100, T4
    80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024,      # A100, A10, Orin, L4
    90: 227 * 1024,                                                     # H100, H200
    100: 227 * 1024, 103: 227 * 1024, 120: 99 * 1024,                  # B200, B300, RTX 50
}
#: What every CUDA GPU gives a block without opting in: for a capability
#: the table has neither itself nor its family of, a kernel that fits it
#: launches (a larger config is refused and falls back to XLA).
PORTABLE_SHARED_MEMORY = 48 * 1024


def shared_memory_per_block(compute_capability: int) -> int:
  """Bytes of shared memory one block may use on a GPU of that capability:
  its entry, else its family's (103 reads 100's), else the portable 48 KiB."""
  table = SHARED_MEMORY_PER_BLOCK
  return table.get(compute_capability,
                   table.get(compute_capability // 10 * 10, PORTABLE_SHARED_MEMORY))


#: Pallas' Triton lowering computes element offsets in int32: an array of
#: more elements is out of a kernel's reach.
MAX_ELEMENTS = 2**31 - 1
#: CUDA's limit on a grid's second (and third) dimension.
MAX_GRID_Y = 65535


def dtype_name(dtype: Any) -> str:
  """numpy's name of a dtype, as guard reasons print it ("bfloat16")."""
  return jnp.dtype(dtype).name


def dtype_reason(arrays: Iterable[tuple[str, Any]], supported: Collection[str]) -> str | None:
  """The first of `arrays` ((label, array or None) pairs; None is skipped)
  whose dtype a kernel does not take, said as a guard says it; None if all
  are `supported`."""
  for label, a in arrays:
    if a is not None and dtype_name(a.dtype) not in supported:
      return f"{describe(label, a)}: dtype {dtype_name(a.dtype)} {not_one_of(supported)}"
  return None


def not_one_of(supported: Collection[str]) -> str:
  """How a guard says a dtype is not among those a kernel takes:
  "is not one of ['bfloat16', 'float32']" (sorted, so reasons are stable)."""
  return f"is not one of {sorted(supported)}"


def describe(label: str, a: Any) -> str:
  """An argument as guard reasons name it, e.g. "x bfloat16[8, 128]"."""
  return f"{label} {dtype_name(a.dtype)}{list(a.shape)}"


def mask2(rows: Any, cols: Any) -> Any:
  """[len(rows), len(cols)] mask from optional row/column masks (None: all
  true; both None: None, an unmasked access)."""
  if rows is None and cols is None:
    return None
  if rows is None:
    return cols[None, :]
  if cols is None:
    return rows[:, None]
  return rows[:, None] & cols[None, :]


def read_tile(view: Any, mask: Any) -> Any:
  """A tile: unmasked where `mask` is None, else zeros outside it."""
  if mask is None:
    return view[...]
  # A float zero for float refs: Triton's lowering cannot cast an int to fp8.
  zero = 0.0 if jnp.issubdtype(view.dtype, jnp.floating) else 0
  return load(view, mask, zero)


def write_tile(view: Any, value: Any, mask: Any) -> None:
  """Stores a tile in the view's dtype, only where `mask` holds (None: all)."""
  if mask is None:
    view[...] = value.astype(view.dtype)
  else:
    store(view, value, mask)


def atomic_add(ref: Any, idx: Any, value: Any, mask: Any, *, interpret: bool) -> None:
  """Masked `ref[idx] += value`, atomic against the other programs.

  Interpret mode's discharge rule takes no mask; there the masked-out lanes
  add zero instead, and lie in the block's padding or inside the array.
  """
  value = value.astype(ref.dtype)
  if interpret:
    _plgpu.atomic_add(ref, idx, jnp.where(mask, value, jnp.zeros_like(value)))
  else:
    _plgpu.atomic_add(ref, idx, value, mask=mask)

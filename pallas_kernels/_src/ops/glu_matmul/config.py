"""Block sizes for the GLU matmul kernels: the only place for those rules.

One program owns a [block_m, block_n] tile of the [M, F] result and keeps two
f32 accumulators of that size (gate and up), walking K in `block_k` steps.
The backward kernel has the same tiling (it recomputes both accumulators and
reads one dy tile), so one `Config` serves both.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu
from pallas_kernels._src.ops.tiling import fit_stages, is_pow2, next_pow2

#: Smallest tile edge Triton's `tt.dot` accepts.
GPU_MIN_BLOCK = 16
#: Interpret mode pays per grid step and loop trip, not per element.
_CPU_MAX_BLOCK = 256


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one GLU matmul launch (forward or backward).

  Attributes:
    block_m: rows of x (and of the result) per program; a power of two.
    block_n: columns of w_gate / w_up (and of the result) per program.
    block_k: depth of one accumulation step; a power of two.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the K loop (GPU only).
  """

  block_m: int = 64
  block_n: int = 64
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be >= 1: {self}")


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
  return int(min(hi, max(lo, next_pow2(n))))


def smem_bytes(cfg: Config, itemsize: int) -> int:
  """Shared memory of the K-loop pipeline: per stage one x tile and two w tiles."""
  per_stage = (cfg.block_m * cfg.block_k + 2 * cfg.block_k * cfg.block_n) * itemsize
  return per_stage * cfg.num_stages


def heuristic_config(m: int, f: int, k: int, dtype, backend: backend_lib.Backend, *,
                     device_kind: str = "") -> Config:
  """Tiling for act(x @ w_gate) * (x @ w_up) with x [m, k], weights [k, f].

  Args:
    m: rows of x (leading dims folded in).
    f: columns of each weight (and of the result).
    k: contraction length.
    dtype: dtype the tiles feed the dot in (f32/bf16/f16).
    backend: where the kernel runs; CPU means interpret mode.
    device_kind: the target's `device_kind` (shared memory budget).
  """
  itemsize = jnp.dtype(dtype).itemsize
  if backend is backend_lib.Backend.CPU:
    return Config(block_m=_clamp_pow2(m, 1, _CPU_MAX_BLOCK),
                  block_n=_clamp_pow2(f, 1, _CPU_MAX_BLOCK),
                  block_k=_clamp_pow2(k, 1, _CPU_MAX_BLOCK), num_warps=4, num_stages=1)
  lo = GPU_MIN_BLOCK
  # Two f32 accumulators: a 128x64 tile pair holds as many registers as the
  # matmul's 128x128 tile, which needs 8 warps to leave room for operands.
  if m <= 64:
    bm, bn = _clamp_pow2(m, lo, 64), _clamp_pow2(f, lo, 64)
  else:
    bm, bn = _clamp_pow2(m, lo, 128), _clamp_pow2(f, lo, 64)
  # IEEE f32 dots run on FMA units with operand tiles in registers: shallow K.
  bk = _clamp_pow2(k, lo, 32 if itemsize >= 4 else 64)
  warps = 8 if bm * bn >= 128 * 64 else 4
  stages = 4 if itemsize < 4 else 3
  budget = matmul_gpu.shared_memory_bytes_of(device_kind)
  cfg = Config(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
  return fit_stages(cfg, lambda c: smem_bytes(c, itemsize), budget)


def choose_config(m: int, f: int, k: int, dtype, interpret: bool) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
  kind = backend_lib.device_kind() if backend is backend_lib.Backend.GPU else ""
  return heuristic_config(m, f, k, dtype, backend, device_kind=kind)

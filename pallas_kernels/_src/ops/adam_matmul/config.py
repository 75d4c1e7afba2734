"""Block sizes for the Adam weight-gradient kernel: the only place for those rules.

One program owns a [block_k, block_n] tile of the [K, N] weight (and so of
its gradient, its moments and its update) and walks the M rows of x and dy
(the tokens) in `block_m` steps with one f32 accumulator; the epilogue then
reads the tile's param, mu and nu and writes their updates. The gradient
product is the matmul op's x^T @ dy with the result's rows being K, so the
tiles come from `matmul.config.heuristic_config` with its (m, n, k) read as
(K, N, M), capped where the epilogue's three extra f32 tiles need registers.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.matmul import config as matmul_config
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu
from pallas_kernels._src.ops.tiling import fit_stages, is_pow2

#: Smallest tile edge Triton's `tt.dot` accepts.
GPU_MIN_BLOCK = matmul_config.GPU_MIN_BLOCK
#: The epilogue's four f32 tiles (the accumulator, param, mu, nu) per program on GPU.
_GPU_MAX_TILE = adam.GPU_MAX_TILE


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one adam_matmul launch.

  Attributes:
    block_k: rows of the weight (columns of x) per program; a power of two.
    block_n: columns of the weight (of dy) per program; a power of two.
    block_m: rows of x and dy (tokens) per accumulation step; a power of two.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the M loop (GPU only).
  """

  block_k: int = 64
  block_n: int = 64
  block_m: int = 64
  num_warps: int = 4
  num_stages: int = 3

  def __post_init__(self):
    for name in ("block_k", "block_n", "block_m", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be >= 1: {self}")


def smem_bytes(cfg: Config, itemsize: int) -> int:
  """Shared memory of the M-loop pipeline: per stage one x and one dy tile."""
  return (cfg.block_m * cfg.block_k + cfg.block_m * cfg.block_n) * itemsize * cfg.num_stages


def heuristic_config(m: int, k: int, n: int, dtype, backend: backend_lib.Backend, *,
                     device_kind: str = "") -> Config:
  """Tiling for the Adam step of a [k, n] weight whose gradient sums m rows.

  Args:
    m: rows of x and dy (the tokens, summed over).
    k: columns of x (rows of the weight).
    n: columns of dy (and of the weight).
    dtype: dtype the tiles feed the dot in (f32/bf16/f16).
    backend: where the kernel runs; CPU means interpret mode.
    device_kind: the target's `device_kind` (shared memory budget).
  """
  mm = matmul_config.heuristic_config(k, n, m, dtype, backend, device_kind=device_kind)
  bk, bn, bm = mm.block_m, mm.block_n, mm.block_k
  warps, stages = mm.num_warps, mm.num_stages
  if backend is not backend_lib.Backend.CPU:
    while bk * bn > _GPU_MAX_TILE and max(bk, bn) > GPU_MIN_BLOCK:
      if bn >= bk:
        bn //= 2
      else:
        bk //= 2
    warps = 8 if bk * bn >= 64 * 128 else 4
    budget = matmul_gpu.shared_memory_bytes_of(device_kind)
    itemsize = jnp.dtype(dtype).itemsize
    cfg = Config(block_k=bk, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)
    return fit_stages(cfg, lambda c: smem_bytes(c, itemsize), budget)
  return Config(block_k=bk, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)


def choose_config(m: int, k: int, n: int, dtype, interpret: bool) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = matmul_config.tiling_backend(interpret)
  kind = backend_lib.device_kind() if backend is backend_lib.Backend.GPU else ""
  return heuristic_config(m, k, n, dtype, backend, device_kind=kind)

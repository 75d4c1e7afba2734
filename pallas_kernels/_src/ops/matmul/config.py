"""Tile sizes for the matmul kernels: the only place that knows them.

Forward: one program owns a [block_m, block_n] output tile, walks K in steps of
`block_k` with an f32 accumulator in registers, applies the epilogue to the
accumulator and stores once. Programs are ordered in groups of `group_m` row
tiles so that neighbouring programs reuse the same weight columns from L2.

Backward (the fused dAct + bias-gradient kernel): one program owns `block_n`
columns and `rows_per_program` rows, walked in sub-tiles of `block_m` rows,
and writes one f32 partial row of the bias and scale gradients.

Rules that depend on the backend live here and in `gpu.py` (Triton limits);
`guard.py` checks a user-supplied `Config` against them.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
  return int(min(hi, max(lo, next_pow2(n))))


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one forward matmul launch.

  Attributes:
    block_m: rows of x (and of the output) per program; a power of two.
    block_n: columns of w (and of the output) per program; a power of two.
    block_k: depth of one accumulation step; a power of two.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the K loop (GPU only).
    group_m: row tiles per L2 swizzle group (1 = plain row-major order).
  """

  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3
  group_m: int = 8

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k", "num_warps"):
      value = getattr(self, name)
      if not isinstance(value, int) or not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    if self.num_stages < 1 or self.group_m < 1:
      raise ValueError(f"Config.num_stages and group_m must be >= 1: {self}")


@dataclasses.dataclass(frozen=True, slots=True)
class BackwardConfig:
  """Tiling of the fused dAct + bias-gradient backward kernel.

  Attributes:
    block_m: rows per sub-tile; a power of two.
    block_n: columns per program; a power of two.
    rows_per_program: rows one program walks (a multiple of block_m); each
      program writes one f32 partial row of db / dscale, summed by XLA.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton pipelining stages of the row loop (GPU only).
  """

  block_m: int = 64
  block_n: int = 128
  rows_per_program: int = 64
  num_warps: int = 4
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_m", "block_n", "num_warps"):
      value = getattr(self, name)
      if not isinstance(value, int) or not is_pow2(value):
        raise ValueError(f"BackwardConfig.{name} must be a power of two, got {value!r}")
    if self.rows_per_program < self.block_m or self.rows_per_program % self.block_m:
      raise ValueError("BackwardConfig.rows_per_program must be a positive multiple "
                       f"of block_m: {self}")
    if self.num_stages < 1:
      raise ValueError(f"BackwardConfig.num_stages must be >= 1: {self}")


#: Smallest tile edge Triton's `tt.dot` accepts (MMA fragments are 16 wide).
GPU_MIN_BLOCK = 16
#: Largest row a fused quantizing epilogue keeps in one tile, by backend: the
#: per-row scale needs the row's max, so the whole row must live in registers.
#: Wider rows are quantized by XLA from an f32 kernel output (one extra pass).
MAX_FUSED_QUANTIZE_N = {
    backend_lib.Backend.GPU: 256,
    backend_lib.Backend.TPU: 256,
    backend_lib.Backend.CPU: 4096,
}
#: Interpret mode pays per grid step and per loop trip, not per element: big
#: tiles keep the CPU tests fast.
_CPU_MAX_BLOCK = 512
#: Backward: aim for about this many programs (several per SM on an H100/H200).
_BWD_TARGET_PROGRAMS = 528


def _is_hopper_or_newer(kind: str) -> bool:
  return gpu.shared_memory_bytes_of(kind) >= 200 * 1024


def heuristic_config(m: int, n: int, k: int, dtype, backend: backend_lib.Backend, *,
                     group_size: int | None = None, fused_quantize: bool = False,
                     packed_n: bool = False, device_kind: str = "",
                     tf32: bool = False) -> Config:
  """Forward tiling for an [m, k] @ [k, n] product computed in `dtype`.

  Args:
    m: rows of the (batch-folded) output.
    n: columns of the output.
    k: contraction length.
    dtype: the compute dtype the tiles are fed to the dot in (f32/bf16/f16).
    backend: where the kernel runs; CPU means interpret mode.
    group_size: K-group length of per-group weight scales; `block_k` then
      divides it so that every K step lies in one group.
    fused_quantize: the epilogue quantizes per row, so one tile must span the
      whole row (`block_n >= n`) when the row is narrow enough.
    packed_n: w is int4 packed along N (Triton cannot mask a packed axis), so
      on GPU `block_n` should divide n.
    device_kind: the target's `device_kind`, for generation-specific tiles.
    tf32: float32 tiles feed TF32 tensor cores (precision DEFAULT/HIGH), not
      the FMA units (HIGHEST).

  Returns:
    A valid `Config` for the backend (powers of two, Triton minimums on GPU).
  """
  itemsize = jnp.dtype(dtype).itemsize
  if backend is backend_lib.Backend.CPU:
    bm = _clamp_pow2(m, 1, _CPU_MAX_BLOCK)
    bn = _clamp_pow2(n, 1, _CPU_MAX_BLOCK)
    bk = _clamp_pow2(k, 1, _CPU_MAX_BLOCK)
    warps, stages = 4, 1
  else:
    # Chosen from `scripts/gpu_compile_report.py` (Triton 3.9, sm_90a and
    # sm_80; README has the table): the f32 accumulator costs bm*bn/(32*warps)
    # registers per thread, so a 128x128 tile needs 8 warps to leave room for
    # the operands and the epilogue (GELU's erf is long). 128x256 tiles and
    # 128x128 with 4 warps hit 255 registers and spill on both.
    lo = GPU_MIN_BLOCK
    if m <= 64:
      # Skinny (decode-like) products: few rows, so spend the tile on K and N.
      bm, bn, bk = _clamp_pow2(m, lo, 64), _clamp_pow2(n, lo, 128), _clamp_pow2(k, lo, 128)
    elif itemsize >= 4 and not tf32:
      # IEEE f32 dots run on the FMA units, operand tiles in registers too.
      bm, bn, bk = _clamp_pow2(m, lo, 64), _clamp_pow2(n, lo, 128), _clamp_pow2(k, lo, 32)
    else:
      # Tensor cores: bf16/f16 (and quantized operands converted to them) or TF32.
      bm, bn = _clamp_pow2(m, lo, 128), _clamp_pow2(n, lo, 128)
      bk = _clamp_pow2(k, lo, 32 if itemsize >= 4 else 64)
    fma = itemsize >= 4 and not tf32
    warps = 8 if bm * bn >= (64 if fma else 128) * 128 else 4
    stages = 4 if _is_hopper_or_newer(device_kind) and itemsize < 4 else 3
  if group_size is not None and group_size >= 1 and is_pow2(group_size):
    bk = min(bk, group_size)
  if packed_n and backend is not backend_lib.Backend.CPU and n % bn:
    divisor = n & -n  # Largest power of two dividing n.
    if divisor >= GPU_MIN_BLOCK:
      bn = min(bn, divisor)
  if fused_quantize:
    limit = MAX_FUSED_QUANTIZE_N[backend]
    if n <= limit:
      lo = 1 if backend is backend_lib.Backend.CPU else GPU_MIN_BLOCK
      bn = _clamp_pow2(n, lo, limit)
      if backend is not backend_lib.Backend.CPU:
        # Keep the f32 tile at <= 128x128 registers' worth.
        bm = max(GPU_MIN_BLOCK, min(bm, (128 * 128) // bn))
  if backend is not backend_lib.Backend.CPU:
    # Fit the K-loop pipeline in shared memory (compute itemsize bounds the
    # stored tiles'): fewer stages first, then a shorter K step.
    budget = gpu.shared_memory_bytes_of(device_kind)
    while bk > GPU_MIN_BLOCK and (bm * bk + bk * bn) * itemsize > budget // 2:
      bk //= 2
    stages = int(max(1, min(stages, budget // ((bm * bk + bk * bn) * itemsize))))
  return Config(block_m=bm, block_n=bn, block_k=bk, num_warps=warps,
                num_stages=stages, group_m=8)


def heuristic_backward_config(rows: int, n: int, backend: backend_lib.Backend,
                              *, batch: int = 1) -> BackwardConfig:
  """Tiling of the fused dAct + bias-gradient kernel.

  Args:
    rows: rows per batch entry (M of the forward output).
    n: columns (N of the forward output).
    backend: where the kernel runs; CPU means interpret mode.
    batch: number of batch entries (each has its own row chunks).
  """
  if backend is backend_lib.Backend.CPU:
    bm = _clamp_pow2(rows, 1, _CPU_MAX_BLOCK)
    bn = _clamp_pow2(n, 1, _CPU_MAX_BLOCK)
    # One chunk: interpret mode prefers a loop to more grid steps.
    return BackwardConfig(block_m=bm, block_n=bn, rows_per_program=bm * -(-rows // bm),
                          num_warps=4, num_stages=1)
  bn = _clamp_pow2(n, GPU_MIN_BLOCK, 128)
  bm = _clamp_pow2(rows, GPU_MIN_BLOCK, max(GPU_MIN_BLOCK, 8192 // bn))
  col_programs = -(-n // bn)
  row_blocks = -(-rows // bm)
  chunks = max(1, min(row_blocks, -(-_BWD_TARGET_PROGRAMS // max(1, col_programs * batch))))
  steps = -(-row_blocks // chunks)
  return BackwardConfig(block_m=bm, block_n=bn, rows_per_program=bm * steps,
                        num_warps=4 if bm * bn <= 4096 else 8, num_stages=2)


def tiling_backend(interpret: bool) -> backend_lib.Backend:
  """The backend whose tiling rules apply: CPU rules whenever interpreting."""
  return backend_lib.Backend.CPU if interpret else backend_lib.current_backend()


def choose_config(m: int, n: int, k: int, dtype, interpret: bool, *,
                  group_size: int | None = None, fused_quantize: bool = False,
                  packed_n: bool = False, precision: str = "HIGHEST") -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = tiling_backend(interpret)
  kind = backend_lib.device_kind() if backend is backend_lib.Backend.GPU else ""
  return heuristic_config(m, n, k, dtype, backend, group_size=group_size,
                          fused_quantize=fused_quantize, packed_n=packed_n,
                          device_kind=kind, tf32=precision != "HIGHEST")

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
      if not is_pow2(value):
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
      if not is_pow2(value):
        raise ValueError(f"BackwardConfig.{name} must be a power of two, got {value!r}")
    if self.rows_per_program < self.block_m or self.rows_per_program % self.block_m:
      raise ValueError("BackwardConfig.rows_per_program must be a positive multiple "
                       f"of block_m: {self}")
    if self.num_stages < 1:
      raise ValueError(f"BackwardConfig.num_stages must be >= 1: {self}")


@dataclasses.dataclass(frozen=True, slots=True)
class MosaicConfig:
  """Tiling of the Mosaic GPU (Hopper) matmul (`mosaic_gpu.py`).

  A CTA is three warpgroups: one issues TMA copies, two compute, each owning
  a [tile_m, tile_n] accumulator; the CTA tile is twice that along
  `wg_dimension`. The defaults are JAX's `hopper_matmul_mgpu` configuration
  (its benchmark's 128x128x64, 4 stages, 64x64 epilogue pieces, warpgroups
  along N).

  Attributes:
    tile_m: accumulator rows per compute warpgroup (a multiple of 64: wgmma's M).
    tile_n: accumulator columns per compute warpgroup (a multiple of
      `epi_tile_n`, at most 256: wgmma's N).
    tile_k: depth of one pipeline step (its rows of 16-bit values span one
      128-byte swizzle at 64).
    stages: pipeline depth: K steps whose tiles are in flight at once.
    epi_tile_m, epi_tile_n: the epilogue's pieces, each staged through
      shared memory and stored by TMA (two in flight per warpgroup).
    wg_dimension: "n" (the two warpgroups split N) or "m".
    compute_wgs: compute warpgroups, 2 or 1: with one, a thread may hold 255
      registers instead of 168 (three warpgroups share the register file),
      room that converting quantized tiles beside the accumulator needs.
    grid_minor: the output axis consecutive tiles walk first ("n" or "m").
    grid_tile_width: tiles per band of the planar snake (L2 reuse).
    memory_registers: registers per thread the TMA warpgroup keeps (the
      compute warpgroups get the rest).
  """

  tile_m: int = 128
  tile_n: int = 128
  tile_k: int = 64
  stages: int = 4
  epi_tile_m: int = 64
  epi_tile_n: int = 64
  wg_dimension: str = "n"
  compute_wgs: int = 2
  grid_minor: str = "n"
  grid_tile_width: int = 1
  memory_registers: int = 40

  def __post_init__(self):
    if self.tile_m % 64 or self.tile_m < 64:
      raise ValueError(f"MosaicConfig.tile_m must be a multiple of 64 (wgmma), got "
                       f"{self.tile_m}")
    if not 8 <= self.tile_n <= 256 or self.tile_n % self.epi_tile_n:
      raise ValueError(f"MosaicConfig.tile_n must be in [8, 256] and a multiple of "
                       f"epi_tile_n={self.epi_tile_n}, got {self.tile_n}")
    if self.tile_m % self.epi_tile_m or self.epi_tile_m % 64:
      raise ValueError(f"MosaicConfig.epi_tile_m must divide tile_m and be a multiple of "
                       f"64: {self}")
    if self.tile_k % 16 or self.tile_k < 16:
      raise ValueError(f"MosaicConfig.tile_k must be a multiple of 16, got {self.tile_k}")
    if self.stages < 1 or self.grid_tile_width < 1:
      raise ValueError(f"MosaicConfig.stages and grid_tile_width must be >= 1: {self}")
    if self.compute_wgs not in (1, 2):
      raise ValueError(f"MosaicConfig.compute_wgs must be 1 or 2, got {self.compute_wgs}")
    if self.wg_dimension not in ("m", "n") or self.grid_minor not in ("m", "n"):
      raise ValueError(f"MosaicConfig.wg_dimension and grid_minor are 'm' or 'n': {self}")


@dataclasses.dataclass(frozen=True, slots=True)
class OperandPaths:
  """How x and w reach the Mosaic GPU kernel's wgmma."""

  #: Both 8-bit of one kind (int8, or float8) and K-major: wgmma multiplies
  #: them as stored (int8 into an exact int32 accumulator).
  native_8bit: bool
  #: The operand is converted (quantized) or made K-major (TF32 wgmma reads
  #: K-major operands only) into a compute-dtype shared memory buffer.
  x_staged: bool
  w_staged: bool


def mosaic_operand_paths(x_dtype, w_dtype, compute_dtype, transpose_x: bool,
                         transpose_w: bool) -> OperandPaths:
  """The operand paths of a Mosaic GPU matmul (`mosaic_gpu.Plan` reads them)."""
  x, w, c = (jnp.dtype(d).name for d in (x_dtype, w_dtype, compute_dtype))
  same_kind = (x == w == "int8") or (x.startswith("float8") and w.startswith("float8"))
  native = same_kind and not transpose_x and transpose_w
  tf32 = c == "float32"
  return OperandPaths(
      native_8bit=native,
      x_staged=not native and (x != c or (tf32 and transpose_x)),
      w_staged=not native and (w != c or (tf32 and not transpose_w)))


def _bytes(dtype) -> float:
  dt = jnp.dtype(dtype)
  return 0.5 if dt.name == "int4" else dt.itemsize


def mosaic_smem_bytes(cfg: MosaicConfig, *, x_dtype, w_dtype, compute_dtype, out_dtype,
                      residual_dtype=None, aux_dtype=None, col_vectors: int = 0,
                      row_scale: bool = False, quantize: bool = False,
                      group_size: int | None = None, transpose_x: bool = False,
                      transpose_w: bool = False) -> int:
  """Dynamic shared memory of one Mosaic GPU matmul CTA, from its allocations
  (`mosaic_gpu._kernel`): the pipeline's ring of x and w tiles (and a group
  scale row per step), the two warpgroups' output pieces (two slots each),
  a residual's when its dtype differs from the output's, aux pieces, the
  dequantized w tiles, the epilogue's vectors, and barriers."""
  two = cfg.compute_wgs
  cta_m = cfg.tile_m * (two if cfg.wg_dimension == "m" else 1)
  cta_n = cfg.tile_n * (two if cfg.wg_dimension == "n" else 1)
  step = cta_m * cfg.tile_k * _bytes(x_dtype) + cfg.tile_k * cta_n * _bytes(w_dtype)
  if group_size:
    step += cta_n * 4
  total = cfg.stages * step
  pieces = (cfg.tile_m // cfg.epi_tile_m) * (cfg.tile_n // cfg.epi_tile_n)
  slots = min(2, pieces)
  piece = cfg.epi_tile_m * cfg.epi_tile_n
  total += two * slots * piece * _bytes(out_dtype)
  if residual_dtype is not None and jnp.dtype(residual_dtype) != jnp.dtype(out_dtype):
    total += two * slots * piece * _bytes(residual_dtype)
  if aux_dtype is not None:
    total += two * piece * _bytes(aux_dtype)
  paths = mosaic_operand_paths(x_dtype, w_dtype, compute_dtype, transpose_x, transpose_w)
  if paths.w_staged:
    total += two * cfg.tile_k * cfg.tile_n * _bytes(compute_dtype)
  if paths.x_staged:
    total += two * cfg.tile_k * (cfg.tile_m if cfg.wg_dimension == "m" else cta_m) * _bytes(
        compute_dtype)
  del col_vectors, row_scale  # Read from global memory, no shared memory.
  total += two * cfg.tile_m * 4 * int(quantize)
  # mbarriers: the pipeline's two per stage and ours, 8 bytes each, padded.
  total += 8 * (2 * cfg.stages + two * slots) + 128
  return int(total)


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
    # Chosen from `python -m pallas_kernels compile-report --backend triton`
    # (Triton 3.9, sm_90a and sm_80; docs/ops.md has the table): the f32
    # accumulator costs bm*bn/(32*warps) registers per thread, so a 128x128
    # tile needs 8 warps to leave room for the operands and the epilogue
    # (GELU's erf is long). 128x256 tiles and 128x128 with 4 warps hit 255
    # registers and spill on both.
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


def heuristic_mosaic_config(m: int, n: int, k: int, *, x_dtype, w_dtype, compute_dtype,
                            out_dtype, residual_dtype=None, aux_dtype=None,
                            col_vectors: int = 0, row_scale: bool = False,
                            fused_quantize: bool = False, group_size: int | None = None,
                            transpose_x: bool = False, transpose_w: bool = False,
                            device_kind: str = "") -> MosaicConfig:
  """The Mosaic GPU tiling for an [m, k] @ [k, n] product.

  JAX's `hopper_matmul_mgpu` configuration (128x128 per warpgroup, two along
  N, 64-deep steps, 4 stages, 64x64 epilogue pieces), adjusted:
    * TF32 (float32 operands): 32-deep steps (128-byte rows, as for 16 bits);
      8-bit operands wgmma takes as stored: 128-deep;
    * an operand converted in shared memory (quantized): one compute
      warpgroup (255 registers a thread, not 168) and 2 stages;
    * per-group w scales: steps no deeper than a group;
    * a fused per-row quantization (n <= 256): the warpgroups split M, each
      holding whole rows (tile_n covers n), so a row's max is local;
    * then stages, fewest 2, until `mosaic_smem_bytes` fits the device.
  Interpret mode uses the same tiling: it validates what would compile.
  """
  cfg = MosaicConfig()
  paths = mosaic_operand_paths(x_dtype, w_dtype, compute_dtype, transpose_x, transpose_w)
  if paths.native_8bit:
    cfg = dataclasses.replace(cfg, tile_k=128)  # 128-byte rows of 8-bit values.
  elif jnp.dtype(compute_dtype).itemsize >= 4:
    cfg = dataclasses.replace(cfg, tile_k=32)
  if paths.x_staged or paths.w_staged:
    # Converting a tile beside a 128x128 accumulator needs more than the 168
    # registers a thread has with two compute warpgroups, and more than 255
    # where a short K loop is unrolled over 4 stages (ptxas spills, see the
    # compile report): one compute warpgroup, 2 stages.
    cfg = dataclasses.replace(cfg, compute_wgs=1, stages=2)
  if group_size is not None and group_size % 16 == 0 and group_size < cfg.tile_k:
    cfg = dataclasses.replace(cfg, tile_k=group_size)
  if fused_quantize and n <= MAX_FUSED_QUANTIZE_N[backend_lib.Backend.GPU]:
    tile_n = -(-n // 64) * 64
    cfg = dataclasses.replace(cfg, tile_m=64, tile_n=tile_n, wg_dimension="m")
  budget = gpu.shared_memory_bytes_of(device_kind or "H100")

  def smem(c):
    return mosaic_smem_bytes(c, x_dtype=x_dtype, w_dtype=w_dtype, compute_dtype=compute_dtype,
                             out_dtype=out_dtype, residual_dtype=residual_dtype,
                             aux_dtype=aux_dtype, col_vectors=col_vectors,
                             row_scale=row_scale, quantize=fused_quantize,
                             group_size=group_size, transpose_x=transpose_x,
                             transpose_w=transpose_w)

  while cfg.stages > 2 and smem(cfg) > budget:
    cfg = dataclasses.replace(cfg, stages=cfg.stages - 1)
  return cfg


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

"""Block sizes of the weight-gradient kernel: the only place for those rules.

The weight gradient [KH, KW, C/groups, F] is small and its contraction, the
N*HO*WO output pixels, is large (a MobileNet layer: 9 x 16 x 16 weights over
800k pixels). Tiling the weights alone leaves a few dozen programs each
walking every pixel, so the pixels are split too (`splits`, split-K): each
split's programs walk their own pixel range into an f32 partial, and the
partials are summed after the kernel (a [splits, KH*KW, C/groups, F] sum,
weights-sized, not pixels-sized).

With Adam's update as the epilogue a program must hold its tile's whole
gradient before it updates the tile: one split, each program walking every
pixel. Its four f32 tiles (the gradient, param, mu and nu) bound the tile on
GPU as adam_matmul's do (`adam.GPU_MAX_TILE`).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu
from pallas_kernels._src.ops.tiling import fit_stages, is_pow2, next_pow2

#: Smallest tile edge Triton's `tt.dot` accepts.
GPU_MIN_BLOCK = 16
#: Interpret mode pays per grid step and loop trip, not per element.
_CPU_MAX_BLOCK = 256
#: A GPU split walks at least this many pixel tiles (each split's partial
#: costs a [C/groups, F] f32 store and its share of the final sum).
_MIN_STEPS_PER_SPLIT = 8
#: Programs per streaming multiprocessor the splits aim for.
_PROGRAMS_PER_CORE = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of one weight-gradient launch.

  Attributes:
    block_p: output pixels per step (the dot's contraction); a power of two.
    block_c: input channels (of one group) per program; a power of two.
      Unused by depthwise convolutions (one input channel per group).
    block_f: output channels (of one group) per program; a power of two.
    splits: pixel ranges, each walked by its own programs into a partial sum.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the pixel loop (GPU only).
  """

  block_p: int = 64
  block_c: int = 32
  block_f: int = 64
  splits: int = 1
  num_warps: int = 4
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_p", "block_c", "block_f", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    for name in ("splits", "num_stages"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Config.{name} must be an int >= 1, got {value!r}")


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
  return int(min(hi, max(lo, next_pow2(n))))


def tile_elements(cfg: Config, depthwise: bool) -> int:
  """Elements of one program's weight tile (and f32 accumulator)."""
  return cfg.block_f if depthwise else cfg.block_c * cfg.block_f


def smem_bytes(cfg: Config, itemsize: int, depthwise: bool, update: bool = False) -> int:
  """Shared memory of the pixel-loop pipeline: per stage an x tile and a dy
  tile. With the update, at least its four f32 tiles, which Triton may stage
  through shared memory to change their layouts for the stores (after the
  loop, when the pipeline's buffers are free: the larger of the two counts)."""
  x_cols = cfg.block_f if depthwise else cfg.block_c
  pipeline = (cfg.block_p * (x_cols + cfg.block_f) * itemsize) * cfg.num_stages
  if not update:
    return pipeline
  return max(pipeline, 4 * 4 * tile_elements(cfg, depthwise))


def heuristic_config(pixels: int, cg: int, fg: int, taps: int, groups: int, dtype,
                     backend: backend_lib.Backend, *, device_kind: str = "",
                     cores: int | None = None, update: bool = False) -> Config:
  """Tiling for the weight gradient of one convolution.

  Args:
    pixels: N * HO * WO, the contraction length.
    cg, fg: input and output channels per group.
    taps: KH * KW.
    groups: feature groups (depthwise: groups == C, cg == 1).
    dtype: dtype the tiles feed the dot in (f32/bf16/f16).
    backend: where the kernel runs; CPU means interpret mode.
    device_kind: the target's `device_kind` (shared memory budget).
    cores: streaming multiprocessors of the target (None: an H200's 132).
    update: Adam's update is the epilogue (one split).
  """
  itemsize = jnp.dtype(dtype).itemsize
  depthwise = cg == 1
  f_span = fg * groups if depthwise else fg  # depthwise tiles F across groups
  if backend is backend_lib.Backend.CPU:
    return Config(block_p=_clamp_pow2(pixels, 1, _CPU_MAX_BLOCK),
                  block_c=_clamp_pow2(cg, 1, _CPU_MAX_BLOCK),
                  block_f=_clamp_pow2(f_span, 1, _CPU_MAX_BLOCK), splits=1,
                  num_warps=4, num_stages=1)
  lo = GPU_MIN_BLOCK
  # IEEE f32 dots run on FMA units with operands in registers: shorter steps.
  bp = 32 if itemsize >= 4 else 64
  bc = _clamp_pow2(cg, lo, 64)
  bf = _clamp_pow2(f_span, lo, 128 if depthwise else 64)
  tiles = taps * (_cdiv(f_span, bf) if depthwise
                  else groups * _cdiv(cg, bc) * _cdiv(fg, bf))
  want = math.ceil(_PROGRAMS_PER_CORE * (cores or 132) / tiles)
  most = max(1, pixels // (bp * _MIN_STEPS_PER_SPLIT))
  splits = 1 if update else int(max(1, min(want, most)))
  cfg = Config(block_p=bp, block_c=bc, block_f=bf, splits=splits,
               num_warps=4, num_stages=3 if itemsize < 4 else 2)
  budget = matmul_gpu.shared_memory_bytes_of(device_kind)
  return fit_stages(cfg, lambda c: smem_bytes(c, itemsize, depthwise, update), budget)


def choose_config(pixels: int, cg: int, fg: int, taps: int, groups: int, dtype,
                  interpret: bool, update: bool = False) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
  kind = cores = None
  if backend is backend_lib.Backend.GPU:
    t = backend_lib.target()
    kind, cores = t.device_kind, t.core_count
  return heuristic_config(pixels, cg, fg, taps, groups, dtype, backend,
                          device_kind=kind or "", cores=cores, update=update)

"""Block sizes for the conv2d kernel: the only place for those rules.

A program owns `block_p` output pixels (a run of the flattened HO * WO
positions of one image, i.e. one or more output rows) by `block_f` output
channels of one group. Per kernel tap it gathers the `block_p` input pixels
that tap reads, `block_c` input channels at a time, and accumulates a
[block_p, block_c] @ [block_c, block_f] product into one f32 accumulator
(depthwise: an element-wise multiply-accumulate, `block_c` unused).
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
  """Tiling of one conv2d launch.

  Attributes:
    block_p: output pixels per program (flattened HO * WO); a power of two.
    block_f: output channels per program (within one group).
    block_c: input channels per accumulation step (dense and grouped).
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the tap loop (GPU only).
  """

  block_p: int = 64
  block_f: int = 64
  block_c: int = 32
  num_warps: int = 4
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_p", "block_f", "block_c", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be >= 1: {self}")


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
  return int(min(hi, max(lo, next_pow2(n))))


def smem_bytes(cfg: Config, itemsize: int, depthwise: bool) -> int:
  """Shared memory of the tap loop's pipeline: per stage the gathered input
  tile and the weight tile (depthwise: neither feeds a dot, so an estimate
  of what Triton stages for the loads)."""
  if depthwise:
    per_stage = (cfg.block_p * cfg.block_f + cfg.block_f) * itemsize
  else:
    per_stage = (cfg.block_p * cfg.block_c + cfg.block_c * cfg.block_f) * itemsize
  return per_stage * cfg.num_stages


def heuristic_config(pixels: int, f_group: int, c_group: int, dtype,
                     backend: backend_lib.Backend, *, depthwise: bool,
                     device_kind: str = "") -> Config:
  """Tiling for a convolution of `pixels` output pixels per image.

  Args:
    pixels: HO * WO.
    f_group: output channels per group (all of F for depthwise).
    c_group: input channels per group (the contraction per tap).
    dtype: dtype the tiles feed the dot in (f32/bf16/f16).
    backend: where the kernel runs; CPU means interpret mode.
    depthwise: one input channel per group (no dot).
    device_kind: the target's `device_kind` (shared memory budget).
  """
  itemsize = jnp.dtype(dtype).itemsize
  if backend is backend_lib.Backend.CPU:
    return Config(block_p=_clamp_pow2(pixels, 1, _CPU_MAX_BLOCK),
                  block_f=_clamp_pow2(f_group, 1, _CPU_MAX_BLOCK),
                  block_c=_clamp_pow2(c_group, 1, _CPU_MAX_BLOCK), num_warps=4,
                  num_stages=1)
  lo = GPU_MIN_BLOCK
  if depthwise:
    # No dot: a [block_p, block_f] f32 accumulator and one gathered tile of the
    # same size; channels are contiguous in NHWC, so a wide block_f coalesces.
    return Config(block_p=_clamp_pow2(pixels, lo, 64), block_f=_clamp_pow2(f_group, lo, 64),
                  block_c=lo, num_warps=4, num_stages=2)
  # The gathered input rows are not contiguous (each pixel's channels are):
  # a 128-pixel tile of up to 64 channels keeps the loads wide along C.
  bp = _clamp_pow2(pixels, lo, 128)
  bf = _clamp_pow2(f_group, lo, 128 if itemsize < 4 else 64)
  # IEEE f32 dots run on FMA units with operand tiles in registers: shallow C.
  bc = _clamp_pow2(c_group, lo, 32 if itemsize >= 4 else 64)
  warps = 8 if bp * bf >= 128 * 128 else 4
  budget = matmul_gpu.shared_memory_bytes_of(device_kind)
  cfg = Config(block_p=bp, block_f=bf, block_c=bc, num_warps=warps, num_stages=3)
  return fit_stages(cfg, lambda c: smem_bytes(c, itemsize, False), budget)


def choose_config(pixels: int, f_group: int, c_group: int, dtype, interpret: bool, *,
                  depthwise: bool) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
  kind = backend_lib.device_kind() if backend is backend_lib.Backend.GPU else ""
  return heuristic_config(pixels, f_group, c_group, dtype, backend, depthwise=depthwise,
                          device_kind=kind)

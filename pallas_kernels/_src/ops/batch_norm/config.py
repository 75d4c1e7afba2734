"""Block sizes of the batch-norm kernels: the only place for those rules.

x is viewed as [M, C] (M = N*H*W pixels, channels last). Every kernel tiles
it in [block_m, block_c] tiles. The two column-sum passes (the forward's
statistics, the backward's dbeta/dgamma) reduce over M, which dwarfs C (a
MobileNet layer: 72 channels over 200k pixels), so M is split into `splits`
ranges, each walked by its own programs in `block_m` steps into an f32
partial row; the [splits, C] partials are summed by XLA after the kernel.
The elementwise passes (y, dx) take one tile per program.
"""

from __future__ import annotations

import dataclasses
import math

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2

#: Elements of a tile, by backend. GPU: 4K f32 values over 4 warps is 32 per
#: thread for each of the two inputs a backward tile holds. Interpret mode
#: pays per grid step and loop trip, not per element.
_TILE_ELEMENTS = {backend_lib.Backend.GPU: 4096, backend_lib.Backend.CPU: 1 << 16}
#: Widest channel tile (more channels are more programs).
_MAX_BLOCK_C = {backend_lib.Backend.GPU: 128, backend_lib.Backend.CPU: 1024}
#: A GPU split walks at least this many row tiles (each costs a [C] f32
#: partial row and its share of the combine).
_MIN_STEPS_PER_SPLIT = 8
#: Programs per streaming multiprocessor the splits aim for.
_PROGRAMS_PER_CORE = 4


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of the batch-norm kernels.

  Attributes:
    block_m: pixels (rows of the [M, C] view) per tile; a power of two.
    block_c: channels per tile; a power of two.
    splits: row ranges of the column-sum passes, each summed into its own
      f32 partial row.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the row loop (GPU only).
  """

  block_m: int = 32
  block_c: int = 128
  splits: int = 1
  num_warps: int = 4
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_m", "block_c", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    for name in ("splits", "num_stages"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Config.{name} must be an int >= 1, got {value!r}")

  def steps(self, m: int) -> int:
    """Row tiles one split walks (the last split's range may pass M)."""
    return max(1, -(-(-(-m // self.block_m)) // self.splits))


def heuristic_config(m: int, c: int, backend: backend_lib.Backend, *,
                     cores: int | None = None) -> Config:
  """Tiling for x viewed as [m, c] on `backend` (CPU: interpret mode).

  Args:
    m: pixels, the product of every axis but the last.
    c: channels.
    backend: where the kernels run.
    cores: streaming multiprocessors of the target (None: an H200's 132).
  """
  cpu = backend is not backend_lib.Backend.GPU
  table = backend_lib.Backend.CPU if cpu else backend_lib.Backend.GPU
  bc = int(min(_MAX_BLOCK_C[table], next_pow2(c)))
  bm = int(max(1, min(next_pow2(m), _TILE_ELEMENTS[table] // bc)))
  if cpu:
    return Config(block_m=bm, block_c=bc, splits=1, num_warps=4, num_stages=1)
  c_tiles = -(-c // bc)
  want = math.ceil(_PROGRAMS_PER_CORE * (cores or 132) / c_tiles)
  most = max(1, m // (bm * _MIN_STEPS_PER_SPLIT))
  return Config(block_m=bm, block_c=bc, splits=int(max(1, min(want, most))),
                num_warps=4, num_stages=2)


def choose_config(m: int, c: int, interpret: bool) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
  cores = backend_lib.target().core_count if backend is backend_lib.Backend.GPU else None
  return heuristic_config(m, c, backend, cores=cores)

"""Block sizes of the group-norm kernels: the only place for those rules.

x is viewed as [N, R, C] (R = H*W pixels of a sample, channels last). A
program takes one sample and as many whole groups of channels as fit a
`block_c`-wide tile; it walks the sample's R rows in `block_m` steps twice
(statistics, then the apply, or the backward's sums, then dx), so a sample of
any size streams through registers.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2

#: Elements of a tile, by backend. GPU: 4K f32 values over 4 warps is 32 per
#: thread for each of the two inputs a backward tile holds. Interpret mode
#: pays per grid step and loop trip, not per element.
_TILE_ELEMENTS = {backend_lib.Backend.GPU: 4096, backend_lib.Backend.CPU: 1 << 16}
#: Widest channel tile the heuristic starts from (a wider group widens it).
_BLOCK_C = {backend_lib.Backend.GPU: 128, backend_lib.Backend.CPU: 1024}
#: A group's channels must fit one tile row: the widest tile the kernels take.
MAX_BLOCK_C = 4096
#: Programs per streaming multiprocessor the channel tiles aim for.
_PROGRAMS_PER_CORE = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of the group-norm kernels.

  Attributes:
    block_m: pixels (rows of a sample's [R, C] view) per tile; a power of two.
    block_c: widest channel tile; a power of two. A program takes the
      `block_c // (C // groups)` whole groups that fit (at least one group
      must: `guard.py`), in a tile of the next power of two of their width.
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the row loops (GPU only).
  """

  block_m: int = 32
  block_c: int = 128
  num_warps: int = 4
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_m", "block_c", "num_warps"):
      value = getattr(self, name)
      if not is_pow2(value):
        raise ValueError(f"Config.{name} must be a power of two, got {value!r}")
    if not isinstance(self.num_stages, int) or isinstance(self.num_stages, bool) or \
        self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be an int >= 1, got {self.num_stages!r}")

  def groups_per_program(self, c: int, groups: int) -> int:
    """Whole groups one program takes (0: a group is wider than block_c)."""
    return min(groups, self.block_c // (c // groups))

  def padded(self, r: int, c: int, groups: int) -> tuple[int, int]:
    """(rows, channels) of a sample's block: R to whole row tiles, C to the
    last window's whole tile (every tile then lies inside the block, see
    `rows.py`). Needs at least one group per program."""
    per_program = self.groups_per_program(c, groups)
    width = per_program * (c // groups)
    windows = -(-groups // per_program)
    return (-(-r // self.block_m) * self.block_m,
            (windows - 1) * width + next_pow2(width))


def heuristic_config(n: int, r: int, c: int, groups: int, backend: backend_lib.Backend, *,
                     cores: int | None = None) -> Config:
  """Tiling for x viewed as [n, r, c] in `groups` groups on `backend` (CPU:
  interpret mode).

  Args:
    n: samples.
    r: pixels per sample, the product of the middle axes.
    c: channels.
    groups: channel groups (divides c).
    backend: where the kernels run.
    cores: streaming multiprocessors of the target (None: an H200's 132).
  """
  cpu = backend is not backend_lib.Backend.GPU
  table = backend_lib.Backend.CPU if cpu else backend_lib.Backend.GPU
  narrowest = next_pow2(c // groups)
  bc = int(min(MAX_BLOCK_C, max(narrowest, min(_BLOCK_C[table], next_pow2(c)))))
  if not cpu:
    # Fewer groups per program where the samples alone leave cores idle.
    want = _PROGRAMS_PER_CORE * (cores or 132)
    while bc > narrowest and n * -(-groups // max(1, bc // (c // groups))) < want:
      bc //= 2
  bm = int(max(1, min(next_pow2(r), _TILE_ELEMENTS[table] // bc)))
  return Config(block_m=bm, block_c=bc, num_warps=4, num_stages=1 if cpu else 2)


def choose_config(n: int, r: int, c: int, groups: int, interpret: bool) -> Config:
  """`heuristic_config` for the backend this call runs on (CPU when interpreting)."""
  backend = backend_lib.Backend.CPU if interpret else backend_lib.current_backend()
  cores = backend_lib.target().core_count if backend is backend_lib.Backend.GPU else None
  return heuristic_config(n, r, c, groups, backend, cores=cores)

"""Where buffers sit over the schedule: the memory view's geometry.

Each buffer is a band from its definition to its last use; bands are stacked
first-fit (the lowest offset free for the buffer's whole live range, as a
heap allocator places it), so the bands live at a step never overlap and
their top traces the memory in use. Pure function; the HTML draws it.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq

from hlo_audit._src.analysis.buffers import Buffer


@dataclasses.dataclass(frozen=True, slots=True)
class Band:
  buffer: Buffer
  #: Bytes below it (first-fit offset).
  offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryLayout:
  bands: tuple[Band, ...]
  #: Top of the highest band.
  height: int
  #: Buffers left out (smaller than every band drawn), and their bytes.
  omitted: int
  omitted_bytes: int


def stack_buffers(buffers, max_bands: int = 2000) -> MemoryLayout:
  """First-fit bands for the `max_bands` largest buffers (Pallas-internal
  ones excluded): a picture with more bands than pixels says nothing more,
  and the cost stays bounded for modules of any size."""
  live = [b for b in buffers if not b.internal and b.bytes > 0]
  live.sort(key=lambda b: -b.bytes)
  drawn, rest = live[:max_bands], live[max_bands:]
  drawn.sort(key=lambda b: (b.live_range[0], -b.bytes))
  # The free gaps below the top of the bands live at the current start, as
  # sorted (low, high) offsets: a band takes the lowest gap it fits, else
  # sits on top. Gaps are few where bands are many (a walk of the live
  # bands per band was quadratic), and a retiring band's memory merges with
  # the gaps beside it.
  gaps: list[tuple[int, int]] = []
  top = 0
  live_tops: list[int] = []  # the live bands' high offsets, sorted
  ends: list[tuple[int, int, int]] = []  # a min-heap of (last step, low, high)
  bands, height = [], 0
  for b in drawn:
    start, end = b.live_range
    size = b.bytes
    while ends and ends[0][0] < start:
      _, lo, hi = heapq.heappop(ends)
      del live_tops[bisect.bisect_left(live_tops, hi)]
      top = _free(gaps, top, lo, hi, live_tops)
    for i, (lo, hi) in enumerate(gaps):
      if hi - lo >= size:
        offset = lo
        if hi - lo == size:
          del gaps[i]
        else:
          gaps[i] = (lo + size, hi)
        break
    else:
      offset = top
      top += size
    bisect.insort(live_tops, offset + size)
    heapq.heappush(ends, (end, offset, offset + size))
    bands.append(Band(b, offset))
    if offset + size > height:
      height = offset + size
  return MemoryLayout(tuple(bands), height, len(rest), sum(b.bytes for b in rest))


def _free(gaps: list[tuple[int, int]], top: int, lo: int, hi: int,
          live_tops: list[int]) -> int:
  """Returns `[lo, hi)` of a retired band to `gaps`, merged with the gaps
  beside it; or, when the band was on top, drops the gap below it and
  returns the new top: the highest live band's (the gaps are maximal, so
  that is where the merged gap began)."""
  i = bisect.bisect_left(gaps, (lo, lo))
  if i and gaps[i - 1][1] == lo:  # the gap below
    i -= 1
    lo = gaps.pop(i)[0]
  if i < len(gaps) and gaps[i][0] == hi:  # the gap above
    hi = gaps.pop(i)[1]
  if hi == top:
    return live_tops[-1] if live_tops else 0
  gaps.insert(i, (lo, hi))
  return top


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
  """One pixel column of an aggregated memory view."""

  #: The step shown: the column's step with the most bytes live.
  step: int
  #: Bytes live at that step, by lifetime class (in `Lifetime` order).
  by_lifetime: tuple[int, ...]
  #: The largest buffers live at that step (largest first).
  largest: tuple[Buffer, ...]


def aggregate_columns(buffers, n_steps: int, columns: int, top: int = 3) -> tuple[Column, ...]:
  """The memory view of a module with more buffers than pixels: per pixel
  column, the bytes live at its busiest step, split by lifetime class, and
  the largest buffers there. Linear in buffers + steps (numpy)."""
  import numpy as np

  from hlo_audit._src.analysis.buffers import Lifetime

  kinds = list(Lifetime)
  live = [b for b in buffers if not b.internal and b.bytes > 0]
  n = max(1, n_steps, 1 + max((b.live_range[1] for b in live), default=0))
  start = np.fromiter((b.live_range[0] for b in live), np.int64, len(live))
  end = np.fromiter((b.live_range[1] for b in live), np.int64, len(live))
  size = np.fromiter((b.bytes for b in live), np.int64, len(live))
  kind = np.fromiter((kinds.index(b.lifetime) for b in live), np.int64, len(live))
  # Bytes live per step and class: difference arrays, then a running sum.
  diff = np.zeros((len(kinds), n + 1), np.int64)
  np.add.at(diff, (kind, start), size)
  np.add.at(diff, (kind, end + 1), -size)
  per_step = np.cumsum(diff, axis=1)[:, :n]
  total = per_step.sum(axis=0)
  out = []
  edges = np.linspace(0, n, min(columns, n) + 1).astype(np.int64)
  for c0, c1 in zip(edges[:-1], edges[1:]):
    if c1 <= c0:
      continue
    s = int(c0 + np.argmax(total[c0:c1]))
    at = np.nonzero((start <= s) & (end >= s))[0]
    best = at[np.argsort(-size[at], kind="stable")[:top]]
    out.append(Column(s, tuple(int(v) for v in per_step[:, s]),
                      tuple(live[i] for i in best)))
  return tuple(out)


def live_at(buffers, step: int) -> list[Buffer]:
  """Buffers live at `step`, largest first."""
  return sorted((b for b in buffers if not b.internal and b.bytes > 0
                 and b.live_range[0] <= step <= b.live_range[1]), key=lambda b: -b.bytes)

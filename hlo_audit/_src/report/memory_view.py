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
  # Active bands as (offset, end_offset, last_step), sorted by offset.
  # Every active band is live at the current start, so they never overlap.
  active: list[tuple[int, int, int]] = []
  ends: list[int] = []  # a min-heap of the active bands' last steps
  bands, height = [], 0
  for b in drawn:
    start, end = b.live_range
    size = b.bytes
    if ends and ends[0] < start:  # most bands retire none
      active = [a for a in active if a[2] >= start]
      while ends and ends[0] < start:
        heapq.heappop(ends)
    offset = 0
    for lo, hi, _ in active:  # sorted by offset: the first gap that fits
      if lo - offset >= size:
        break
      if hi > offset:
        offset = hi
    bisect.insort(active, (offset, offset + size, end))
    heapq.heappush(ends, end)
    bands.append(Band(b, offset))
    if offset + size > height:
      height = offset + size
  return MemoryLayout(tuple(bands), height, len(rest), sum(b.bytes for b in rest))


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

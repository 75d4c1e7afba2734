"""XLA's best-fit packing of the temporaries' heap, on intervals whose
packing can be worked out by hand."""

from __future__ import annotations

from hlo_audit._src.analysis.heap_packing import HeapValue, pack_heap


def _v(name, start, end, size, buffer=None):
  return HeapValue((name, ()), start, end, size, ((buffer or name), ()))


def _pack(values, alignment=1, shares=()):
  shares = set(shares)
  reads = {}
  for a, b in shares:
    reads.setdefault((b, ()), []).append((a, ()))
  return pack_heap(values, alignment=alignment, operands=lambda v: reads.get(v, ()),
                   may_overwrite=lambda o, u: (o[0], u[0]) in shares)


def test_disjoint_lifetimes_reuse_one_chunk():
  assert _pack([_v("a", 0, 1, 100), _v("b", 2, 3, 100), _v("c", 4, 5, 80)]) == 100


def test_a_gap_too_small_for_the_next_buffer_is_fragmentation():
  # Largest first: a (0-9) and b (0-4) stacked; c (5-9) fits in b's place;
  # d (5-9) does not fit beside c under a and goes on top. Live at most:
  # a + c + d = 100 + 40 + 60; the heap: a + b's 50 + d = 210.
  values = [_v("a", 0, 9, 100), _v("b", 0, 4, 50), _v("c", 5, 9, 40), _v("d", 5, 9, 60)]
  # Spatial order places a, d (60) ... the smaller of the two orders wins.
  assert _pack(values) == 200
  live = max(sum(v.size for v in values if v.start <= t <= v.end) for t in range(10))
  assert live == 200


def test_best_fit_leaves_a_hole_max_live_cannot_see():
  # At most 90 bytes are live at once (a + b at step 3). Largest first: a and
  # c at 0 (apart in time), b above a at 50, d above b and c at 90: 120.
  # Longest first: b at 0, d at 40, a at 40, and c finds no 50-byte gap
  # under d: 70 + 50 = 120. Both orders leave 30 bytes of holes.
  values = [_v("a", 3, 3, 50), _v("b", 0, 4, 40), _v("c", 5, 5, 50), _v("d", 4, 6, 30)]
  live = max(sum(v.size for v in values if v.start <= t <= v.end) for t in range(7))
  assert live == 90
  assert _pack(values) == 120


def test_chunks_are_aligned():
  assert _pack([_v("a", 0, 5, 4), _v("b", 0, 5, 4)], alignment=256) == 260
  assert _pack([_v("a", 0, 5, 4), _v("b", 0, 5, 4)]) == 8


def test_an_output_that_takes_a_dying_operands_memory_is_colocated():
  # b is written where a dies and may overwrite it: one chunk.
  assert _pack([_v("a", 0, 3, 64), _v("b", 3, 6, 64)], shares={("a", "b")}) == 64
  assert _pack([_v("a", 0, 3, 64), _v("b", 3, 6, 64)]) == 128


def test_values_of_one_buffer_share_its_chunk():
  values = [_v("init", 0, 2, 32, "loop"), _v("body", 3, 6, 32, "loop"),
            _v("tmp", 1, 4, 32)]
  assert _pack(values) == 64


def test_a_chain_of_outputs_each_over_the_last_is_one_chunk():
  # b overwrites a, c overwrites b: a's chunk holds all three, so x, live
  # beside c, goes above it (128); were c not placed with a, x would fit at
  # offset 0 once b is gone (64).
  values = [_v("a", 0, 3, 64), _v("b", 3, 6, 64), _v("c", 6, 9, 64), _v("x", 7, 9, 64)]
  assert _pack(values, shares={("a", "b"), ("b", "c")}) == 128

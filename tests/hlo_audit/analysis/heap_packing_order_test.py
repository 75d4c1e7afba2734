"""The order XLA's best-fit heap places equal-size values in: size, then
duration, both descending (GlobalDecreasingSizeBestFitHeap's spatial
order), on a case where that order decides the heap's size; and XLA:TPU's
order, the order the values are defined in."""

from __future__ import annotations

from hlo_audit._src.analysis.buffer_sharing import heap_model
from hlo_audit._src.analysis.heap_packing import (DECREASING_ORDERS, HeapValue, PackingOrder,
                                                  pack_heap)


def _v(name, start, end, size):
  return HeapValue((name, ()), start, end, size, (name, ()))


def _pack(values):
  return pack_heap(values, alignment=1, operands=lambda v: (),
                   may_overwrite=lambda o, u: False)


def test_equal_sizes_go_longest_first():
  # In event counters (one per Alloc and Free, in step order): c [0,4],
  # a [1,2], d [3,7], b [5,6]. Spatial order: b (30), then the two 20s
  # longest first, c before a, then d (10):
  #   b at 0; c at 0 (apart from b in time); a above c at 20; d, live with
  #   c and b, above b at 30: 40 bytes.
  # The 20s shortest first would put a at 0 and c above it at 20, leaving d
  # only the top of c's chunk: 50. The temporal order (longest first: c, d,
  # b, a) gives 60, so the smaller of the two heaps is the spatial one.
  values = [_v("a", 2, 2, 20), _v("b", 5, 5, 30), _v("c", 1, 4, 20), _v("d", 4, 6, 10)]
  assert _pack(values) == 40
  # The most bytes ever live at once is the same 40: no fragmentation.
  assert max(sum(v.size for v in values if v.start <= t <= v.end) for t in range(7)) == 40


def test_the_longer_of_two_equal_values_goes_below():
  # Events: a [0,2], c [1,4], b [3,7], d [5,6]. Spatial: the 30s longest
  # first, c at 0 and a above it at 30; then b, live with c, takes a's place
  # at 30, and d c's place at 0: 60. Shortest first puts a at 0 and c at 30,
  # d at 0, and b, live with c and d, finds no 20 bytes below c: 80 (the
  # temporal order gives 80 too).
  values = [_v("a", 2, 2, 30), _v("b", 3, 5, 20), _v("c", 2, 3, 30), _v("d", 4, 4, 20)]
  assert _pack(values) == 60


def test_definition_order_keeps_the_heap_it_packs():
  # XLA:TPU's order. Events: a [0,2], b [1,5], c [3,4]. In the order they
  # are defined: a (10) at 0, b (100) above it at 10, and c, live with b
  # after a died, finds only a's 10 bytes below b: on top, 210. Largest
  # first puts b at 0 and a and c (apart in time) above it: 200. The
  # definition order alone is run, so its larger heap stands.
  values = [_v("a", 0, 1, 10), _v("b", 0, 5, 100), _v("c", 2, 5, 100)]
  assert _pack(values) == 200
  assert pack_heap(values, alignment=1, operands=lambda v: (),
                   may_overwrite=lambda o, u: False,
                   orders=(PackingOrder.DEFINITION,)) == 210


def test_only_the_tpu_packs_in_definition_order():
  assert heap_model("tpu").packing_orders == (PackingOrder.DEFINITION,)
  assert heap_model("tpu", "v5p", "0.0.50.1").packing_orders == (PackingOrder.DEFINITION,)
  assert heap_model("gpu").packing_orders == DECREASING_ORDERS

"""Liveness and the peak model on hand-written modules with known answers,
and the flattened schedule against XLA's own live-range report."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.analysis import liveness
from hlo_audit._src.analysis.dataflow import analyze_dataflow
from hlo_audit._src.analysis.liveness import analyze_liveness
from hlo_audit._src.analysis.schedule import flatten_schedule


def _corpus_file(name: str) -> Path:
  """A module of the third-party corpus (../shared/hlo_corpus or
  $HLO_CORPUS); skips the test when it is absent."""
  root = Path(os.environ.get("HLO_CORPUS") or
              Path(__file__).resolve().parents[3] / ".." / "shared" / "hlo_corpus")
  path = root / name
  if not path.is_file():
    pytest.skip(f"HLO corpus module not found: {path}")
  return path


def _analyze(text):
  m = hlo_audit.parse_hlo(text)
  s = flatten_schedule(m)
  d = analyze_dataflow(m, s)
  return m, s, d, analyze_liveness(m, s, d)


CHAIN = """
HloModule chain, is_scheduled=true
ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %a = f32[1024]{0} exponential(%p)
  %b = f32[1024]{0} negate(%a)
  %c = f32[1024]{0} sqrt(%b)
  ROOT %d = f32[1024]{0} tanh(%c)
}
"""


def test_elementwise_chain_reuses_each_dying_operand():
  # Parameter 4 KiB (read-only, whole run); the output allocation is idle
  # until %d is written, and a, b and c each take the memory of the operand
  # that dies where they are written: the heap is empty.
  _, s, d, live = _analyze(CHAIN)
  assert s.sequence == (("main", "p"), ("main", "a"), ("main", "b"), ("main", "c"), ("main", "d"))
  assert live.allocation_sizes == (4096, 4096)
  assert live.peak_heap_bytes == 0
  assert live.peak_bytes == 8192



def test_replays_on_one_program_build_its_tables_once(monkeypatch):
  # What-if replays run the liveness many times on one module, schedule and
  # dataflow: the tables no edit changes come from the cache after the first.
  m, s, d, first = _analyze(CHAIN)
  built = []
  real = liveness._Tables
  monkeypatch.setattr(liveness, "_Tables", lambda *a: built.append(a) or real(*a))
  cache: dict = {}
  runs = [analyze_liveness(m, s, d, cache=cache) for _ in range(3)]
  assert len(built) == 1 and runs == [first] * 3
  # Another program's dataflow is not served from them.
  analyze_liveness(m, s, analyze_dataflow(m, s), cache=cache)
  assert len(built) == 2

FORK = """
HloModule fork, is_scheduled=true
ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %a = f32[1024]{0} exponential(%p)
  %b = f32[1024]{0} negate(%a)
  %c = f32[1024]{0} sqrt(%a)
  ROOT %d = f32[1024]{0} add(%b, %c)
}
"""


def test_operand_with_a_later_reader_is_not_overwritten():
  # As XLA's BufferAssigner: %d (output) gets an allocation; %a fits in it
  # before %d is written; %b overlaps %a (still read by %c), so it goes to the
  # heap; %c takes over %a's memory as %a dies where %c is written, and %d
  # takes over %c's. Parameter 4 KiB + output allocation 4 KiB + heap 4 KiB.
  _, _, _, live = _analyze(FORK)
  assert live.allocation_sizes == (4096, 4096)
  assert live.heap_buffers == {("b", ())}
  assert live.peak_heap_bytes == 4096
  assert live.peak_bytes == 3 * 4096


DONATED = """
HloModule donated, is_scheduled=true, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  ROOT %a = f32[1024]{0} exponential(%p)
}
"""


def test_donated_parameter_shares_the_output_allocation():
  _, _, d, live = _analyze(DONATED)
  assert d.buffer_of[("a", ())] == d.buffer_of[("p", ())]
  assert live.peak_bytes == 4096
  assert not live.parameter_buffers


LOOP = """
HloModule loop, is_scheduled=true
%body (s: (s32[], f32[256])) -> (s32[], f32[256]) {
  %s = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  %v = f32[256]{0} get-tuple-element(%s), index=1
  %e = f32[256]{0} exponential(%v)
  ROOT %t = (s32[], f32[256]{0}) tuple(%n, %e)
}
%cond (s: (s32[], f32[256])) -> pred[] {
  %s = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %c = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}
ENTRY %main (x: f32[256]) -> f32[256] {
  %x = f32[256]{0} parameter(0)
  %zero = s32[] constant(0)
  %copy = f32[256]{0} copy(%x)
  %init = (s32[], f32[256]{0}) tuple(%zero, %copy)
  %w = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"8"}}
  ROOT %r = f32[256]{0} get-tuple-element(%w), index=1
}
"""


def test_while_state_is_one_buffer_and_schedule_flattens_cond_then_body():
  m, s, d, live = _analyze(LOOP)
  names = [n for _, n in s.sequence]
  # Condition, then body, then the while, as XLA's HloLiveRange flattens.
  assert names.index("lt") < names.index("t") < names.index("w")
  state = d.buffer_of[("copy", ())]
  for vid in (("w", (1,)), ("s", (1,)), ("e", ())):
    assert d.buffer_of[vid] == state
  assert state in live.output_buffers


def test_schedule_and_peak_match_xla_reports_for_a_train_step():
  from hlo_audit._src.examples.transformer import TransformerConfig, example
  fn, args = example(TransformerConfig(batch=2, seq=32, d_model=64, heads=2, d_ff=128))
  cap = hlo_audit.capture(fn, *args, xla_reports=True)
  s = flatten_schedule(cap.module)
  assert [n for _, n in s.sequence] == list(cap.live_range.sequence)
  r = hlo_audit.audit(cap)
  assert abs(r.peak_agreement) <= 0.01


def test_assigner_occupancy_finds_what_a_scan_finds():
  import random

  from hlo_audit._src.analysis.liveness import _Occupancy
  rng = random.Random(0)
  for end in (1, 2, 7, 64, 100):
    occupancy = _Occupancy(end)
    spans: list[tuple[int, int, int]] = []  # (allocation, first, last)
    for _ in range(200):
      s = rng.randrange(end + 1)
      e = min(end, s + rng.choice([0, 1, 2, rng.randrange(end + 1)]))
      i = rng.randrange(40)
      occupancy.add([(s, e, None)], i)
      spans.append((i, s, e))
      qs = rng.randrange(end + 1)
      qe = min(end, qs + rng.randrange(4))
      # Overlapping other than at an end: what _interferes rejects without
      # asking whether one value may follow the other (a value of one step
      # is left to _Allocation.fits).
      want = 0
      for j, a, b in spans:
        if qs < qe and a <= qe and qs <= b and b != qs and qe != a:
          want |= 1 << j
      assert occupancy.busy([(qs, qe, None)]) == want, (end, qs, qe)


def test_allocation_fits_sees_a_span_hidden_behind_later_ones():
  from hlo_audit._src.analysis.liveness import _Allocation
  a = _Allocation(8, readonly=False)
  # One buffer's values may overlap (loop state): [0, 10] spans [1, 2] and
  # [3, 4], which start later but end earlier.
  a.add([(0, 10, ("w", ())), (1, 2, ("w", (0,))), (3, 4, ("w", (1,)))])
  assert not a.fits([(6, 6, ("x", ()))], sharer=None)
  assert not a.fits([(5, 7, ("x", ()))], sharer=None)
  assert a.fits([(11, 12, ("x", ()))], sharer=None)


def test_an_allocations_covered_times_are_the_union_of_its_spans():
  # `covered`: the spans, closed intervals, hold every time from 0 to it
  # (-1: not time 0); the first-fit skips allocations busy at every time.
  import random

  from hlo_audit._src.analysis.liveness import _Allocation
  rng = random.Random(1)
  for trial in range(300):
    a = _Allocation(8, readonly=False)
    spans = []
    for n in range(rng.randrange(1, 8)):
      s = rng.randrange(0, 12)
      e = s + rng.randrange(0, 5)
      a.add([(s, e, ("v", (trial, n)))])
      spans.append((s, e))
      want = -1
      grew = True
      while grew:  # the fixpoint: a span starting within the covered times
        grew = False
        for s0, e0 in spans:
          if s0 <= max(want, 0) and e0 > want:
            want, grew = e0, True
      assert a.covered == want, (spans, a.covered, want)


def test_no_allocation_holds_two_overlapping_buffers():
  """A buffer whose values overlap (loop state) once made the assigner's walk
  over an allocation's spans miss later overlaps."""
  path = _corpus_file("xla_benchmarks/hlo_torax_iterhybrid_predictor_corrector_f64__1.hlo")
  m = hlo_audit.parse_hlo(path.read_text())
  s = flatten_schedule(m)
  d = analyze_dataflow(m, s)
  live = analyze_liveness(m, s, d)
  spans: dict[int, list[tuple[int, int, object]]] = {}
  for b, i in live.allocation_of.items():
    if i not in spans:
      spans[i] = []
    spans[i].extend((*live.value_ranges[v], b) for v in d.buffers[b])
  for i, held in spans.items():
    held.sort(key=lambda x: x[:2])
    for x, (s1, e1, b1) in enumerate(held):
      for s2, e2, b2 in held[x + 1:]:
        if s2 >= e1:
          break
        assert b1 == b2 or s2 == e2 or s1 == e1, (i, b1, (s1, e1), b2, (s2, e2))


GTE_READS = """
HloModule gte, is_scheduled=true
%fused (p0: f32[256]) -> (f32[256], f32[256]) {
  %p0 = f32[256]{0} parameter(0)
  %e = f32[256]{0} exponential(%p0)
  %n = f32[256]{0} negate(%p0)
  ROOT %t = (f32[256]{0}, f32[256]{0}) tuple(%e, %n)
}
ENTRY %main (x: f32[256]) -> (f32[256], f32[256]) {
  %x = f32[256]{0} parameter(0)
  %f = (f32[256]{0}, f32[256]{0}) fusion(%x), kind=kLoop, calls=%fused
  %g0 = f32[256]{0} get-tuple-element(%f), index=0
  %a = f32[256]{0} sqrt(%g0)
  %g1 = f32[256]{0} get-tuple-element(%f), index=1
  %b = f32[256]{0} tanh(%g1)
  ROOT %t = (f32[256]{0}, f32[256]{0}) tuple(%a, %b)
}
"""


def test_a_get_tuple_element_reads_no_other_element():
  # XLA's HloValue uses: a get-tuple-element reads the tuple's pointers, not
  # its arrays, so %f{0} dies at %a, not at %g1 (which reads element 1).
  _, s, _, live = _analyze(GTE_READS)
  assert live.value_ranges[("f", (0,))] == (s.time["f"], s.time["a"])
  assert live.value_ranges[("f", (1,))] == (s.time["f"], s.time["b"])


WHILE_INIT = """
HloModule loop, is_scheduled=true
%cond (c: (s32[], f32[64])) -> pred[] {
  %c = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %v = f32[64]{0} get-tuple-element(%p), index=1
  %w = f32[64]{0} exponential(%v)
  ROOT %r = (s32[], f32[64]{0}) tuple(%j, %w)
}
ENTRY %main (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %z = s32[] constant(0)
  %init = f32[64]{0} negate(%x)
  %tup = (s32[], f32[64]{0}) tuple(%z, %init)
  %loop = (s32[], f32[64]{0}) while(%tup), condition=%cond, body=%body
  ROOT %out = f32[64]{0} get-tuple-element(%loop), index=1
}
"""


def test_a_loops_initial_value_is_done_with_when_the_loop_starts():
  # HloLiveRange: the while's use of its operand moves to the loop's start
  # (the condition's parameter), before the loop and the while itself.
  _, s, _, live = _analyze(WHILE_INIT)
  assert s.time["c"] < s.time["p"] < s.time["loop"]
  assert live.value_ranges[("init", ())] == (s.time["init"], s.time["c"])


CONTROL = """
HloModule order, is_scheduled=true
ENTRY %main (x: f32[8]) -> (f32[8], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %a = f32[8]{0} exponential(%x)
  %b = f32[8]{0} negate(%x)
  %c = f32[8]{0} sqrt(%a), control-predecessors={%b}
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%c, %b)
}
"""


def test_the_assigners_post_order_visits_control_predecessors_first():
  # MakeInstructionPostOrder pushes control predecessors after operands, so
  # %b (a control predecessor of %c) comes before %c's operand %a.
  from hlo_audit._src.analysis.liveness import _post_order_positions

  m = hlo_audit.parse_hlo(CONTROL)
  position, _ = _post_order_positions({"main": m.entry})
  order = sorted(position, key=position.get)
  assert order.index("b") < order.index("a") < order.index("c") < order.index("t")

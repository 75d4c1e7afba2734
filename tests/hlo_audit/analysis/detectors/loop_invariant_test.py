"""Loop-invariant work on hand-written while loops: what hoisting saves."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind, Verdict
from hlo_audit._src.analysis.detectors import loop_invariant

# A ten-trip loop whose body recomputes exp(w) from a carry element it passes
# through unchanged, and adds it to the element it updates.
LOOP = """
HloModule loop, is_scheduled=true
%body (s: (s32[], f32[256,256], f32[256,256])) -> (s32[], f32[256,256], f32[256,256]) {
  %s = (s32[], f32[256,256]{1,0}, f32[256,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %w = f32[256,256]{1,0} get-tuple-element(%s), index=1
  %v = f32[256,256]{1,0} get-tuple-element(%s), index=2
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  INVARIANT
  %d = f32[256,256]{1,0} add(%e, %v)
  ROOT %t = (s32[], f32[256,256]{1,0}, f32[256,256]{1,0}) tuple(%n, %w, %d)
}
%cond (s: (s32[], f32[256,256], f32[256,256])) -> pred[] {
  %s = (s32[], f32[256,256]{1,0}, f32[256,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %k = s32[] constant(10)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}
ENTRY %main (w: f32[256,256], v: f32[256,256]) -> f32[256,256] {
  %w = f32[256,256]{1,0} parameter(0)
  %v = f32[256,256]{1,0} parameter(1)
  %z = s32[] constant(0)
  %init = (s32[], f32[256,256]{1,0}, f32[256,256]{1,0}) tuple(%z, %w, %v)
  %loop = (s32[], f32[256,256]{1,0}, f32[256,256]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %out = f32[256,256]{1,0} get-tuple-element(%loop), index=2
}
"""

EXP = "%e = f32[256,256]{1,0} exponential(%w)"


def test_work_on_a_passed_through_carry_element_runs_once_when_hoisted():
  (f,) = hlo_audit.audit_hlo(LOOP.replace("INVARIANT", EXP)).findings_of(
      FindingKind.LOOP_INVARIANT)
  assert (f.boundary, f.boundary_shape, f.consumers) == ("e", "f32[256,256]", ("d",))
  # Nine of its ten runs are redundant, each reading and writing 256 KiB.
  assert f.trip_count == 10 and f.launches_removed == 9
  assert f.bytes_saved == 9 * 2 * 256 * 256 * 4
  assert f.verdict is Verdict.SAFE and f.ops == ("hoist",)
  # The updated element's work changes every trip: not invariant.
  assert not hlo_audit.audit_hlo(LOOP.replace("INVARIANT", EXP).replace(
      "exponential(%w)", "exponential(%v)")).findings_of(FindingKind.LOOP_INVARIANT)


def test_invariant_work_whose_shape_the_text_leaves_unknown_is_still_listed():
  # A broadcast printed without its shape cannot be inferred: what reads it
  # has no shape either. The finder still lists it, shape unknown.
  text = LOOP.replace("INVARIANT", "%c = f32[] constant(2)\n"
                      "  %b = broadcast(%c), dimensions={}\n"
                      "  %x = exponential(%b)\n"
                      "  %e = f32[256,256]{1,0} add(%x, %w)")
  found = {f.boundary: f.boundary_shape for f in
           loop_invariant.find(hlo_audit.audit_hlo(text).program)}
  assert found == {"x": "", "e": "f32[256,256]"}

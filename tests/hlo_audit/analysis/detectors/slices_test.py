"""Materialized slices and concatenates on hand-written optimized HLO: what
the reader would do instead of reading the stored part."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind

CUT = """
HloModule sl, is_scheduled=true

%fused_cut (p0: f32[256,512]) -> f32[128,512] {
  %p0 = f32[256,512]{1,0} parameter(0)
  ROOT %c = f32[128,512]{1,0} CUT
}

%fused_tanh (p0: f32[128,512]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  ROOT %t = f32[128,512]{1,0} tanh(%p0)
}

ENTRY %main (x: f32[256,512]) -> f32[128,512] {
  %x = f32[256,512]{1,0} parameter(0)
  %y = f32[256,512]{1,0} exponential(%x)
  %s = f32[128,512]{1,0} fusion(%y), kind=kLoop, calls=%fused_cut
  ROOT %t = f32[128,512]{1,0} fusion(%s), kind=kLoop, calls=%fused_tanh
}
"""
SLICE = "slice(%p0), slice={[64:192], [0:512]}"
CONCAT = "concatenate(%a, %b), dimensions={0}"
PARTS = ("  %a = f32[64,512]{1,0} slice(%p0), slice={[0:64], [0:512]}\n"
         "  %b = f32[64,512]{1,0} slice(%p0), slice={[192:256], [0:512]}\n  ROOT %c")


def _finding(cut: str) -> hlo_audit.FusionDecisionRecord:
  text = CUT.replace("CUT", cut)
  if cut == CONCAT:
    text = text.replace("  ROOT %c", PARTS)
  (f,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.MATERIALIZED_SLICE)
  return f


def test_a_slice_is_read_in_place_by_offsets_a_concatenate_by_selects():
  s = _finding(SLICE)
  assert (s.boundary, s.ops, len(s.consumers)) == ("s", ("slice",), 1)
  assert s.extra_arithmetic == "offset arithmetic in the reader's loads"
  assert s.bytes_saved == 2 * 128 * 512 * 4
  c = _finding(CONCAT)
  assert c.ops == ("concatenate",)
  assert c.extra_arithmetic == "a select between the parts in the reader's loads"

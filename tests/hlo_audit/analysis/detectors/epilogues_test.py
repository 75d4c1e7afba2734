"""Epilogues after a matmul on hand-written optimized HLO: which readers a
matmul kernel could take in."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind

READER = """
HloModule rw, is_scheduled=true

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_tanh (p0: f32[128,512], p1: f32[128,512]) -> (f32[128,512], f32[128,256]) {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[128,512]{1,0} parameter(1)
  %t = f32[128,512]{1,0} tanh(%p0)
  %z = f32[] constant(-inf)
  %w = f32[128,256]{1,0} reduce-window(%p1, %z), window={size=1x2 stride=1x2}, to_apply=%max
  ROOT %out = (f32[128,512]{1,0}, f32[128,256]{1,0}) tuple(%t, %w)
}

ENTRY %main (x: f32[128,256], w: f32[256,512], y: f32[128,512]) -> (f32[128,512], f32[128,256]) {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %y = f32[128,512]{1,0} parameter(2)
  %d = f32[128,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = (f32[128,512]{1,0}, f32[128,256]{1,0}) fusion(%d, %y), kind=kInput, calls=%fused_tanh
}
"""


def test_a_reader_that_reduces_is_no_epilogue_even_beside_elementwise_work():
  # An input fusion (XLA:GPU's transposing emitter runs elementwise work as
  # one too) is an epilogue only where it reduces and scatters nothing: this
  # one also reduces another operand through a window.
  report = hlo_audit.audit_hlo(READER)
  assert not report.findings_of(FindingKind.UNFUSED_EPILOGUE)
  plain = READER.replace(
      "%w = f32[128,256]{1,0} reduce-window(%p1, %z), window={size=1x2 stride=1x2}, to_apply=%max",
      "%w = f32[128,256]{1,0} slice(%p1), slice={[0:128], [0:256]}")
  (epi,) = hlo_audit.audit_hlo(plain).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.boundary, epi.ops) == ("d", ("activation:tanh",))

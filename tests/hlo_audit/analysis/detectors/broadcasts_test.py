"""Expanded broadcasts on hand-written optimized HLO: a compact value written
at full size for its readers, seen through the views XLA puts on it."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit import FindingKind, Lifetime

EXPAND = """
HloModule bc, is_scheduled=true

%fused_expand (p0: f32[256]) -> ROOT_SHAPE {
  %p0 = f32[256]{0} parameter(0)
  BODY
}

ENTRY %main (v: f32[256], w: f32[256,512]) -> f32[256,512] {
  %v = f32[256]{0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %t = f32[256]{0} tanh(%v)
  %b = ROOT_SHAPE fusion(%t), kind=kLoop, calls=%fused_expand
  ROOT %d = f32[256,512]{1,0} dot(%b, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
PLAIN = ("f32[256,256]{1,0}", "ROOT %e = f32[256,256]{1,0} broadcast(%p0), dimensions={1}")
VIEWED = ("f32[256,256]{1,0}",
          "%e = f32[256,16,16]{2,1,0} broadcast(%p0), dimensions={0}\n"
          "  ROOT %r = f32[256,256]{1,0} bitcast(%e)")


@pytest.mark.parametrize("shape, body", [PLAIN, VIEWED], ids=["plain", "through-bitcast"])
def test_a_broadcast_written_for_a_matmul_is_expanded_even_through_a_view(shape, body):
  r = hlo_audit.audit_hlo(EXPAND.replace("ROOT_SHAPE", shape).replace("BODY", body))
  (f,) = r.findings_of(FindingKind.EXPANDED_BROADCAST)
  assert (f.boundary, f.boundary_shape) == ("b", "f32[256,256]")
  # 256 KiB written and read, minus the 1 KiB compact vector, twice.
  assert f.bytes_saved == 2 * (256 * 256 * 4 - 256 * 4)
  assert r.buffer("b").lifetime is Lifetime.EXPANDED_BROADCAST


MULTI_OUTPUT = """
HloModule bc2, is_scheduled=true

%fused_two (p0: f32[256]) -> (f32[256], f32[256,256]) {
  %p0 = f32[256]{0} parameter(0)
  %n = f32[256]{0} negate(%p0)
  %e = f32[256,256]{1,0} broadcast(%p0), dimensions={1}
  ROOT %t = (f32[256]{0}, f32[256,256]{1,0}) tuple(%n, %e)
}

ENTRY %main (v: f32[256], w: f32[256,512]) -> (f32[256], f32[256,512]) {
  %v = f32[256]{0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %b = (f32[256]{0}, f32[256,256]{1,0}) fusion(%v), kind=kLoop, calls=%fused_two
  %n = f32[256]{0} get-tuple-element(%b), index=0
  %x = f32[256,256]{1,0} get-tuple-element(%b), index=1
  %d = f32[256,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = (f32[256]{0}, f32[256,512]{1,0}) tuple(%n, %d)
}
"""


def test_the_expanded_output_of_a_multi_output_fusion_is_its_own_buffers_lifetime():
  # Output {1} is the broadcast; output {0}, a negation, is not expanded.
  r = hlo_audit.audit_hlo(MULTI_OUTPUT)
  assert r.buffer("b{1}").lifetime is Lifetime.EXPANDED_BROADCAST
  assert r.buffer("b{0}").lifetime is not Lifetime.EXPANDED_BROADCAST

"""A reduce of a reduce counts as one reduction over the first one's
operand: the second reduce's axes are axes of the dims the first one kept."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind

# A loop fusion writes g (f32[8,16,32]); a reduction fusion sums it over dims
# {0,2} as XLA splits that: {0} first (a leading axis, so the kept dims are
# [16,32], axes 1 and 2 of g), then {1} of the result, which is g's axis 2.
MODULE = """
HloModule reduce_of_reduce, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.0 = f32[] add(%a, %b)
}

%fused_scale (p0: f32[8,16,32], p1: f32[8,16,32]) -> f32[8,16,32] {
  %p0 = f32[8,16,32]{2,1,0} parameter(0)
  %p1 = f32[8,16,32]{2,1,0} parameter(1)
  ROOT %m = f32[8,16,32]{2,1,0} multiply(%p0, %p1), metadata={op_name="jit(f)/mul"}
}

%fused_sum (p0: f32[8,16,32]) -> f32[16] {
  %p0 = f32[8,16,32]{2,1,0} parameter(0)
  %z = f32[] constant(0)
  %r1 = f32[16,32]{1,0} reduce(%p0, %z), dimensions={0}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %r = f32[16]{0} reduce(%r1, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
}

ENTRY %main (x: f32[8,16,32], y: f32[8,16,32]) -> (f32[8,16,32], f32[16]) {
  %x = f32[8,16,32]{2,1,0} parameter(0)
  %y = f32[8,16,32]{2,1,0} parameter(1)
  %g = f32[8,16,32]{2,1,0} fusion(%x, %y), kind=kLoop, calls=%fused_scale, metadata={op_name="jit(f)/mul"}
  %s = f32[16]{0} fusion(%g), kind=kInput, calls=%fused_sum, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[8,16,32]{2,1,0}, f32[16]{0}) tuple(%g, %s)
}
"""


def test_a_reduce_after_a_leading_axis_reduce_names_the_operands_axes():
  (f,) = hlo_audit.audit_hlo(MODULE).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert (f.boundary, f.consumers) == ("g", ("s",))
  assert "reduces dims {0,2} of [8,16,32] (256 elements each)" in f.evidence, f.evidence
  assert "(batch axis 0 reduced, one result per index of axes {1})" in f.evidence, f.evidence

"""Prologues before a matmul on hand-written optimized HLO: what the
producer of a matmul's operand does that the matmul could do on load."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit import FindingKind

# An RMSNorm's apply x * rsqrt(mean(x^2) + eps) * gamma rounded to bf16,
# written only for the next projection's dot.
_SCALE = """
  %r = f32[64,256]{1,0} broadcast(%p2), dimensions={0}
  %n = f32[64,256]{1,0} multiply(%p1, %r)
  %g = f32[64,256]{1,0} broadcast(%p0), dimensions={1}
  %y = f32[64,256]{1,0} multiply(%n, %g)"""

_APPLY = """
HloModule norm, is_scheduled=true

%fused_apply (p0: f32[256], p1: f32[64,256], p2: f32[64]) -> T[64,256] {
  %p0 = f32[256]{0} parameter(0)
  %p1 = f32[64,256]{1,0} parameter(1)
  %p2 = f32[64]{0} parameter(2)BODY
}

ENTRY %main (gamma: f32[256], x: f32[64,256], rs: f32[64], w: T[256,512]) -> T[64,512] {
  %gamma = f32[256]{0} parameter(0)
  %x = f32[64,256]{1,0} parameter(1)
  %rs = f32[64]{0} parameter(2)
  %w = T[256,512]{1,0} parameter(3)
  %f = T[64,256]{1,0} fusion(%gamma, %x, %rs), kind=kLoop, calls=%fused_apply
  ROOT %d = T[64,512]{1,0} dot(%f, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/dot_general"}
}
"""


def _apply(body: str, dtype: str) -> str:
  return _APPLY.replace("BODY", body).replace("T[", f"{dtype}[")


@pytest.mark.parametrize("body, dtype, ops", [
    (_SCALE + "\n  ROOT %c = bf16[64,256]{1,0} convert(%y)", "bf16", ("scale", "cast")),
    # The cast alone is a cast; the scale alone a scale.
    ("\n  ROOT %c = bf16[64,256]{1,0} convert(%p1)", "bf16", ("cast",)),
    (_SCALE + "\n  ROOT %c = f32[64,256]{1,0} copy(%y)", "f32", ("scale",)),
])
def test_a_scale_before_the_cast_is_named_with_it(body, dtype, ops):
  # A matmul casting on load would drop the normalization: the prologue's
  # work is the scale and the cast.
  (pro,) = hlo_audit.audit_hlo(_apply(body, dtype)).findings_of(
      FindingKind.UNFUSED_PROLOGUE)
  assert (pro.boundary, pro.ops) == ("f", ops)


# A weight stored narrow, widened and scaled for the dot: a dequantize the
# matmul's loads could do.
_DEQUANT = """
HloModule dequant, is_scheduled=true

%fused_dequant (p0: Q[256,512], p1: S[512]) -> bf16[256,512] {
  %p0 = Q[256,512]{1,0} parameter(0)
  %p1 = S[512]{0} parameter(1)
  %q = f32[256,512]{1,0} convert(%p0)
  %s = f32[512]{0} convert(%p1)
  %b = f32[256,512]{1,0} broadcast(%s), dimensions={1}
  %m = f32[256,512]{1,0} multiply(%q, %b)
  ROOT %c = bf16[256,512]{1,0} convert(%m)
}

ENTRY %main (x: bf16[64,256], wq: Q[256,512], scale: S[512]) -> bf16[64,512] {
  %x = bf16[64,256]{1,0} parameter(0)
  %wq = Q[256,512]{1,0} parameter(1)
  %scale = S[512]{0} parameter(2)
  %w = bf16[256,512]{1,0} fusion(%wq, %scale), kind=kLoop, calls=%fused_dequant
  ROOT %d = bf16[64,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.parametrize("quantized, scale, ops", [
    ("s8", "f32", ("dequantize:s8",)),
    ("u8", "bf16", ("dequantize:u8",)),
    # Two narrow types (fp8 values, int8 scales): the first by name, each time.
    ("f8e4m3fn", "s8", ("dequantize:f8e4m3fn",)),
    ("s8", "f8e4m3fn", ("dequantize:f8e4m3fn",)),
])
def test_a_narrow_weight_widened_and_scaled_is_a_dequantize(quantized, scale, ops):
  text = _DEQUANT.replace("Q[", f"{quantized}[").replace("S[", f"{scale}[")
  (pro,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_PROLOGUE)
  assert (pro.boundary, pro.ops) == ("w", ops)


def test_a_narrow_weight_only_widened_is_a_cast():
  text = _DEQUANT.replace("Q[", "s8[").replace("S[", "f32[").replace(
      "  %m = f32[256,512]{1,0} multiply(%q, %b)\n  ROOT %c = bf16[256,512]{1,0} convert(%m)",
      "  ROOT %c = bf16[256,512]{1,0} convert(%p0)").replace(
      "  %s = f32[512]{0} convert(%p1)\n  %b = f32[256,512]{1,0} broadcast(%s), dimensions={1}\n",
      "")
  (pro,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_PROLOGUE)
  assert (pro.boundary, pro.ops) == ("w", ("cast",))


# int8 weights stored transposed with a zero point: bitcast to unsigned,
# widen, subtract the zero point, scale, transpose, round to bf16: each of
# the five ops a load can do, and nothing else.
_ZERO_POINT = """
HloModule zp, is_scheduled=true

%fused_dequant (p0: s8[512,256], p1: f32[512], p2: f32[512]) -> bf16[256,512] {
  %p0 = s8[512,256]{1,0} parameter(0)
  %p1 = f32[512]{0} parameter(1)
  %p2 = f32[512]{0} parameter(2)
  %u = u8[512,256]{1,0} bitcast-convert(%p0)
  %q = f32[512,256]{1,0} convert(%u)
  %z = f32[512,256]{1,0} broadcast(%p1), dimensions={0}
  %d = f32[512,256]{1,0} subtract(%q, %z)
  %s = f32[512,256]{1,0} broadcast(%p2), dimensions={0}
  %m = f32[512,256]{1,0} multiply(%d, %s)
  %t = f32[256,512]{1,0} transpose(%m), dimensions={1,0}
  ROOT %c = bf16[256,512]{1,0} convert(%t)
}

ENTRY %main (x: bf16[64,256], wq: s8[512,256], zero: f32[512], scale: f32[512]) -> bf16[64,512] {
  %x = bf16[64,256]{1,0} parameter(0)
  %wq = s8[512,256]{1,0} parameter(1)
  %zero = f32[512]{0} parameter(2)
  %scale = f32[512]{0} parameter(3)
  %w = bf16[256,512]{1,0} fusion(%wq, %zero, %scale), kind=kLoop, calls=%fused_dequant
  ROOT %d = bf16[64,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_a_dequantize_with_a_zero_point_using_every_simple_op_is_still_one():
  (pro,) = hlo_audit.audit_hlo(_ZERO_POINT).findings_of(FindingKind.UNFUSED_PROLOGUE)
  assert (pro.boundary, pro.ops) == ("w", ("dequantize:s8", "transpose"))

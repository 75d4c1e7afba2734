"""penzai's llama-like transformer read right: its named axes put the
embedding first ([e, b, t]) and its SwiGLU cuts one gemm's result seen as
[B, T, 2F] (the committed H200 compile, and XLA:CPU's shape of its first
RMSNorm written as scheduled HLO)."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support

E, R = FindingKind.UNFUSED_EPILOGUE, FindingKind.SEPARATE_REDUCTION


def test_a_swiglu_through_a_bitcast_of_its_gemm_is_a_glu():
  r = hlo_audit.audit_hlo(h200_support.fixture("penzai_llama"),
                          options=hlo_audit.AuditOptions(device="h200"))
  glus = [f for f in r.findings_of(E) if f.boundary_shape == "f32[128,256]"]
  assert len(glus) == 2, [(f.boundary, f.ops) for f in r.findings_of(E)]
  for f in glus:
    assert "glu" in f.ops and "activation:silu" in f.ops, f.ops
    assert f.kernel == "pallas_kernels.glu_matmul", f.kernel


# The embedding held first: x [b, t, e] scaled (penzai's embedding lookup)
# and transposed to [e, b, t], summed of squares over e, then rsqrt: an RMS
# norm per token.
_RMS = """
HloModule rms, is_scheduled=true

%t_comp (p: f32[4,32,64]) -> f32[64,4,32] {
  %p = f32[4,32,64]{2,1,0} parameter(0)
  %h = f32[] constant(0.5)
  %hb = f32[4,32,64]{2,1,0} broadcast(%h), dimensions={}
  %s = f32[4,32,64]{2,1,0} multiply(%p, %hb)
  %t = f32[64,4,32]{0,2,1} transpose(%s), dimensions={2,0,1}
  ROOT %c = f32[64,4,32]{2,1,0} copy(%t)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%r_comp (q: f32[64,4,32]) -> f32[4,32] {
  %q = f32[64,4,32]{2,1,0} parameter(0)
  %sq = f32[64,4,32]{2,1,0} multiply(%q, %q)
  %z = f32[] constant(0)
  ROOT %r = f32[4,32]{1,0} reduce(%sq, %z), dimensions={AXES}, to_apply=%add
}

%n_comp (v: f32[4,32], x: f32[4,32,64]) -> f32[4,32,64] {
  %v = f32[4,32]{1,0} parameter(0)
  %x = f32[4,32,64]{2,1,0} parameter(1)
  %e = f32[] constant(1e-06)
  %eb = f32[4,32]{1,0} broadcast(%e), dimensions={}
  %a = f32[4,32]{1,0} add(%v, %eb)
  %rs = f32[4,32]{1,0} rsqrt(%a)
  %b = f32[4,32,64]{2,1,0} broadcast(%rs), dimensions={0,1}
  ROOT %m = f32[4,32,64]{2,1,0} multiply(%x, %b)
}

ENTRY %main (x: f32[4,32,64]) -> f32[4,32,64] {
  %x = f32[4,32,64]{2,1,0} parameter(0)
  %tf = f32[64,4,32]{2,1,0} fusion(%x), kind=kLoop, calls=%t_comp
  %rf = f32[4,32]{1,0} fusion(%tf), kind=kInput, calls=%r_comp
  ROOT %nf = f32[4,32,64]{2,1,0} fusion(%rf, %x), kind=kLoop, calls=%n_comp
}
"""


def test_a_sum_of_squares_over_an_axis_held_first_is_a_per_row_rms_norm():
  (f,) = hlo_audit.audit_hlo(_RMS.replace("AXES", "0")).findings_of(R)
  assert f.ops == ("rms_norm",), f.ops
  assert "batch" not in f.ops[0] and "dims {0} of [64,4,32]" in f.evidence, f.evidence

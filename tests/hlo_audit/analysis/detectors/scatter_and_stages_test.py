"""Scatters, staged reductions and matmul results read through slices or
into the output, on hand-written optimized HLO: what each kernel can and
cannot take over."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind

_ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

SCATTER_INTO_ZEROS = """
HloModule emb, is_scheduled=true
""" + _ADD + """
%fused_zeros (p0: f32[]) -> f32[256,64] {
  %p0 = f32[] parameter(0)
  ROOT %b = f32[256,64]{1,0} broadcast(%p0), dimensions={}
}

%fused_scatter (p0: f32[256,64], p1: s32[128,1], p2: f32[128,1,64]) -> f32[256,64] {
  %p0 = f32[256,64]{1,0} parameter(0)
  %p1 = s32[128,1]{1,0} parameter(1)
  %p2 = f32[128,1,64]{2,1,0} parameter(2)
  ROOT %s = f32[256,64]{1,0} scatter(%p0, %p1, %p2), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

%fused_norm (p0: f32[256,64]) -> f32[] {
  %p0 = f32[256,64]{1,0} parameter(0)
  %sq = f32[256,64]{1,0} multiply(%p0, %p0)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%sq, %z), dimensions={0,1}, to_apply=%add
}

%fused_scale (p0: f32[256,64]) -> f32[256,64] {
  %p0 = f32[256,64]{1,0} parameter(0)
  %c = f32[] constant(0.5)
  %b = f32[256,64]{1,0} broadcast(%c), dimensions={}
  ROOT %m = f32[256,64]{1,0} multiply(%p0, %b)
}

ENTRY %main (i: s32[128,1], u: f32[128,1,64]) -> (f32[], f32[256,64]) {
  %i = s32[128,1]{1,0} parameter(0)
  %u = f32[128,1,64]{2,1,0} parameter(1)
  %zero = f32[] constant(0)
  %t = f32[256,64]{1,0} fusion(%zero), kind=kLoop, calls=%fused_zeros
  %g = f32[256,64]{1,0} fusion(%t, %i, %u), kind=kLoop, calls=%fused_scatter
  %n = f32[] fusion(%g), kind=kInput, calls=%fused_norm
  %o = f32[256,64]{1,0} fusion(%g), kind=kLoop, calls=%fused_scale
  ROOT %out = (f32[], f32[256,64]{1,0}) tuple(%n, %o)
}
"""


def test_a_scatter_add_into_zeros_computes_no_reduction_of_its_result():
  # The embedding gradient's rows are sums of every update landing on them:
  # the sum of squares needs them complete, so neither the scatter nor the
  # broadcast of zeros before it can compute it.
  r = hlo_audit.audit_hlo(SCATTER_INTO_ZEROS)
  assert not r.findings_of(FindingKind.SEPARATE_REDUCTION), r.findings


ONE_HOT = """
HloModule xent, is_scheduled=true
""" + _ADD + """
%fused_grad (p0: f32[4,64,128], p1: f32[4,64]) -> f32[4,64,128] {
  %p0 = f32[4,64,128]{2,1,0} parameter(0)
  %p1 = f32[4,64]{1,0} parameter(1)
  %e = f32[4,64,128]{2,1,0} exponential(%p0)
  %b = f32[4,64,128]{2,1,0} broadcast(%p1), dimensions={0,1}
  ROOT %m = f32[4,64,128]{2,1,0} multiply(%e, %b)
}

%fused_index (p0: s32[4,64]) -> s32[256,3] {
  %p0 = s32[4,64]{1,0} parameter(0)
  %i0 = s32[4,64,1,1]{3,2,1,0} iota(), iota_dimension=INNER0
  %i1 = s32[4,64,1,1]{3,2,1,0} iota(), iota_dimension=1
  %l = s32[4,64,1,1]{3,2,1,0} bitcast(%p0)
  %c = s32[4,64,1,3]{3,2,1,0} concatenate(%i0, %i1, %l), dimensions={3}
  ROOT %r = s32[256,3]{1,0} bitcast(%c)
}

%fused_scatter (p0: f32[4,64,128], p1: s32[256,3], p2: f32[256,1,1,1]) -> f32[4,64,128] {
  %p0 = f32[4,64,128]{2,1,0} parameter(0)
  %p1 = s32[256,3]{1,0} parameter(1)
  %p2 = f32[256,1,1,1]{3,2,1,0} parameter(2)
  ROOT %s = f32[4,64,128]{2,1,0} scatter(%p0, %p1, %p2), update_window_dims={1,2,3}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,1,2}, index_vector_dim=1, to_apply=%add
}

%fused_updates (p0: f32[]) -> f32[256,1,1,1] {
  %p0 = f32[] parameter(0)
  ROOT %b = f32[256,1,1,1]{3,2,1,0} broadcast(%p0), dimensions={}
}

%fused_cast (p0: f32[4,64,128]) -> bf16[4,64,128] {
  %p0 = f32[4,64,128]{2,1,0} parameter(0)
  ROOT %c = bf16[4,64,128]{2,1,0} convert(%p0)
}

ENTRY %main (x: f32[4,64,128], d: f32[4,64], labels: s32[4,64]) -> bf16[4,64,128] {
  %x = f32[4,64,128]{2,1,0} parameter(0)
  %d = f32[4,64]{1,0} parameter(1)
  %labels = s32[4,64]{1,0} parameter(2)
  %k = f32[] constant(-0.004)
  %g = f32[4,64,128]{2,1,0} fusion(%x, %d), kind=kLoop, calls=%fused_grad
  %idx = s32[256,3]{1,0} fusion(%labels), kind=kLoop, calls=%fused_index
  %u = f32[256,1,1,1]{3,2,1,0} fusion(%k), kind=kLoop, calls=%fused_updates
  %sc = f32[4,64,128]{2,1,0} fusion(%g, %idx, %u), kind=kLoop, calls=%fused_scatter
  ROOT %cast = bf16[4,64,128]{2,1,0} fusion(%sc), kind=kLoop, calls=%fused_cast
}
"""


def test_a_one_hot_scatter_between_elementwise_kernels_is_a_prologue():
  # softmax * dloss with -1/N scattered at each row's label (one element a
  # row: the iotas count every row), read only by a cast: the cast could
  # compute the product and the one-hot term (iota == label) on load.
  r = hlo_audit.audit_hlo(ONE_HOT.replace("INNER0", "0"))
  (f,) = [f for f in r.findings if f.boundary == "g"]
  assert f.kind is FindingKind.UNFUSED_PROLOGUE and "one-hot scatter" in f.ops
  assert f.consumers == ("sc", "cast") and f.bytes_saved == 2 * 4 * 64 * 128 * 4


def test_a_scatter_whose_rows_may_collide_is_no_one_hot_update():
  # Both iotas along axis 1: rows of different batch entries share index
  # tuples, so two updates may land on one element: no elementwise form.
  r = hlo_audit.audit_hlo(ONE_HOT.replace("INNER0", "1"))
  assert not [f for f in r.findings if f.boundary == "g" and "one-hot scatter" in f.ops]


TWO_STAGES = """
HloModule rowmax, is_scheduled=true

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_logits (p0: f32[256,4096]) -> f32[256,4096] {
  %p0 = f32[256,4096]{1,0} parameter(0)
  ROOT %e = f32[256,4096]{1,0} tanh(%p0)
}

%fused_stage1 (p0: f32[256,4096]) -> f32[256,16] {
  %p0 = f32[256,4096]{1,0} parameter(0)
  %b = f32[256,16,256]{2,1,0} bitcast(%p0)
  %z = f32[] constant(-inf)
  ROOT %r = f32[256,16]{1,0} reduce(%b, %z), dimensions={2}, to_apply=%max
}

%fused_stage2 (p0: f32[256,16]) -> f32[256] {
  %p0 = f32[256,16]{1,0} parameter(0)
  %z = f32[] constant(-inf)
  ROOT %r = f32[256]{0} reduce(%p0, %z), dimensions={1}, to_apply=%max
}

%fused_apply (p0: f32[256,4096], p1: f32[256]) -> f32[256,4096] {
  %p0 = f32[256,4096]{1,0} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  %b = f32[256,4096]{1,0} broadcast(%p1), dimensions={0}
  ROOT %s = f32[256,4096]{1,0} subtract(%p0, %b)
}

ENTRY %main (x: f32[256,4096]) -> f32[256,4096] {
  %x = f32[256,4096]{1,0} parameter(0)
  %l = f32[256,4096]{1,0} fusion(%x), kind=kLoop, calls=%fused_logits
  %stage1 = f32[256,16]{1,0} fusion(%l), kind=kInput, calls=%fused_stage1
  %stage2 = f32[256]{0} fusion(%stage1), kind=kInput, calls=%fused_stage2
  ROOT %a = f32[256,4096]{1,0} fusion(%l, %stage2), kind=kLoop, calls=%fused_apply
}
"""


def test_a_reduction_staged_over_two_kernels_is_read_whole():
  # XLA's row max over 4096 elements as [256,16,256] reduced over {2}, then
  # the partials over {1} by the next kernel: one statistic per row of 4096.
  r = hlo_audit.audit_hlo(TWO_STAGES)
  (f,) = [f for f in r.findings_of(FindingKind.SEPARATE_REDUCTION) if f.boundary == "l"]
  assert "4096 elements each" in f.evidence and "256 elements" not in f.evidence, f.evidence


SLICES_REDUCED = """
HloModule qkv, is_scheduled=true
""" + _ADD + """
%fused_sumsq (p0: f32[64,192]) -> f32[] {
  %p0 = f32[64,192]{1,0} parameter(0)
  %s = f32[64,64]{1,0} slice(%p0), slice={[0:64], [SLICE]}
  %sq = f32[64,64]{1,0} multiply(%s, %s)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%sq, %z), dimensions={0,1}, to_apply=%add
}

%fused_adam (p0: f32[64,192], p1: f32[]) -> f32[64,192] {
  %p0 = f32[64,192]{1,0} parameter(0)
  %p1 = f32[] parameter(1)
  %b = f32[64,192]{1,0} broadcast(%p1), dimensions={}
  ROOT %m = f32[64,192]{1,0} multiply(%p0, %b)
}

ENTRY %main (x: f32[128,64], dy: f32[128,192]) -> f32[64,192] {
  %x = f32[128,64]{1,0} parameter(0)
  %dy = f32[128,192]{1,0} parameter(1)
  %w = f32[64,192]{1,0} dot(%x, %dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %n0 = f32[] fusion(%w), kind=kInput, calls=%fused_sumsq
  %n1 = f32[] fusion(%w), kind=kInput, calls=%fused_sumsq.1
  %n2 = f32[] fusion(%w), kind=kInput, calls=%fused_sumsq.2
  %a = f32[] add(%n0, %n1)
  %t = f32[] add(%a, %n2)
  ROOT %u = f32[64,192]{1,0} fusion(%w, %t), kind=kLoop, calls=%fused_adam
}
"""


def _slices_reduced() -> str:
  body = SLICES_REDUCED.split("%fused_sumsq (")[1].split("\n}\n")[0]
  parts = [f"%fused_sumsq{sfx} (" + body.replace("SLICE", cols) + "\n}\n"
           for sfx, cols in (("", "0:64"), (".1", "64:128"), (".2", "128:192"))]
  head, tail = SLICES_REDUCED.split("%fused_sumsq (")[0], \
      SLICES_REDUCED.split("%fused_sumsq (")[1].split("\n}\n", 1)[1]
  return head + "".join(parts) + tail


def test_slices_squared_and_summed_are_no_epilogue_of_the_matmul():
  # A fused QKV weight gradient whose three parts clip_by_global_norm squares
  # and sums: the readers need whole slices reduced, not one element each.
  r = hlo_audit.audit_hlo(_slices_reduced())
  (f,) = [f for f in r.findings if f.boundary == "w"]
  assert f.kind is FindingKind.SEPARATE_REDUCTION and "sum_of_squares" in f.ops, f


CAST_OUT = """
HloModule castout, is_scheduled=true

%fused_round (p0: f32[256,64]) -> f32[4,64,64] {
  %p0 = f32[256,64]{1,0} parameter(0)
  %n = bf16[256,64]{1,0} convert(%p0)
  %w = f32[256,64]{1,0} convert(%n)
  ROOT %b = f32[4,64,64]{2,1,0} bitcast(%w)
}

ENTRY %main (x: f32[256,512], y: f32[512,64]) -> f32[4,64,64] {
  %x = f32[256,512]{1,0} parameter(0)
  %y = f32[512,64]{1,0} parameter(1)
  %d = f32[256,64]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %c = f32[4,64,64]{2,1,0} fusion(%d), kind=kLoop, calls=%fused_round
}
"""


def test_a_cast_of_a_matmul_into_the_output_is_the_matmuls_epilogue():
  # The output is written whatever happens: what goes is the dot's result
  # before the cast, an epilogue of the dot, not the cast's own write.
  r = hlo_audit.audit_hlo(CAST_OUT)
  assert not r.findings_of(FindingKind.STANDALONE_COPY), r.findings
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.boundary == "d"

"""Separate reductions on hand-written optimized HLO: a reduction is named
by what it reduces and in which pass."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind

BACKWARD = """
HloModule bw, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_grad (p0: f32[64,128], p1: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  %e = f32[64,128]{1,0} exponential(%p0), metadata={op_name="jit(f)/transpose(jvp())/exp"}
  %m = f32[64,128]{1,0} maximum(%e, %p1), metadata={op_name="jit(f)/transpose(jvp())/max"}
  ROOT %g = f32[64,128]{1,0} multiply(%m, %p1), metadata={op_name="jit(f)/transpose(jvp())/mul"}
}

%fused_sum (p0: f32[64,128]) -> f32[64] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
}

ENTRY %main (x: f32[64,128], y: f32[64,128]) -> (f32[64,128], f32[64]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} parameter(1)
  %g = f32[64,128]{1,0} fusion(%x, %y), kind=kLoop, calls=%fused_grad, metadata={op_name="jit(f)/transpose(jvp())/mul"}
  %s = f32[64]{0} fusion(%g), kind=kInput, calls=%fused_sum, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[64,128]{1,0}, f32[64]{0}) tuple(%g, %s)
}
"""


def test_a_sum_of_a_backward_value_is_no_forward_softmax():
  # The producer is the backward pass's (transpose(jvp()) in its op_name),
  # the reduction's own op_name is the forward primitive's: exp and max in
  # the producer do not make it a softmax, and no softmax kernel is offered.
  (f,) = hlo_audit.audit_hlo(BACKWARD).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.ops == ("reduce",) and f.kernel is None
  assert f.need is None or f.need.anchor != "softmax"


MIX = """
HloModule ct, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  ROOT %e = f32[64,128]{1,0} exponential(%p0), metadata={op_name="jit(f)/exp"}
}

%fused_mix (p0: f32[64,128], p1: f32[64,128]) -> f32[DIMS] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  %m = f32[64,128]{1,0} multiply(%p0, %OTHER), metadata={op_name="jit(f)/mul"}
  %z = f32[] constant(0)
  ROOT %r = f32[DIMS]{0} reduce(%m, %z), dimensions={AXIS}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
}

ENTRY %main (x: f32[64,128], y: f32[64,128]) -> (f32[64,128], f32[DIMS]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} parameter(1)
  %e = f32[64,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_exp, metadata={op_name="jit(f)/exp"}
  %s = f32[DIMS]{0} fusion(%e, %y), kind=kInput, calls=%fused_mix, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[64,128]{1,0}, f32[DIMS]{0}) tuple(%e, %s)
}
"""


def _mix(axis: str, other: str) -> hlo_audit.FusionDecisionRecord:
  dims = "128" if axis == "0" else "64"
  text = MIX.replace("DIMS", dims).replace("AXIS", axis).replace("%OTHER", other)
  (f,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.SEPARATE_REDUCTION)
  return f


def test_a_product_summed_over_its_varying_axis_is_a_contraction():
  # sum_b e[b, i] * y[b, i] over the leading axis, in the forward pass: an
  # einsum XLA runs as multiply + reduce, not a sum over the batch.
  assert _mix("0", "%p1").ops == ("contraction",)
  assert _mix("1", "%p1").ops == ("contraction",)
  # e * e is a square: its sum over the batch is a column reduction.
  square = _mix("0", "%p0")
  assert square.ops == ("column_reduction",) and "over the leading axes" in square.evidence



#: A loop fusion writes g (f32[DIMS]); a reduction fusion reads it alone and
#: reduces it as SUM says (its root %r, of type f32[OUT]).
WRITTEN_THEN_SUMMED = """
HloModule summed, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_scale (p0: f32[DIMS], p1: f32[DIMS]) -> f32[DIMS] {
  %p0 = f32[DIMS]{2,1,0} parameter(0)
  %p1 = f32[DIMS]{2,1,0} parameter(1)
  ROOT %m = f32[DIMS]{2,1,0} multiply(%p0, %p1), metadata={op_name="jit(f)/mul"}
}

%fused_sum (p0: f32[DIMS]) -> f32[OUT] {
  %p0 = f32[DIMS]{2,1,0} parameter(0)
  %z = f32[] constant(0)
SUM
}

ENTRY %main (x: f32[DIMS], y: f32[DIMS]) -> (f32[DIMS], f32[OUT]) {
  %x = f32[DIMS]{2,1,0} parameter(0)
  %y = f32[DIMS]{2,1,0} parameter(1)
  %g = f32[DIMS]{2,1,0} fusion(%x, %y), kind=kLoop, calls=%fused_scale, metadata={op_name="jit(f)/mul"}
  %s = f32[OUT] fusion(%g), kind=kInput, calls=%fused_sum, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[DIMS]{2,1,0}, f32[OUT]) tuple(%g, %s)
}
"""


def _summed(dims: str, out: str, body: str) -> hlo_audit.FusionDecisionRecord:
  text = (WRITTEN_THEN_SUMMED.replace("SUM", body).replace("DIMS", dims)
          .replace("OUT", out))
  (f,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.SEPARATE_REDUCTION)
  return f


def test_a_reduce_of_a_reduce_counts_as_one_over_both_axes():
  # XLA reduces dims {0,2} as {2}, then {0} (a negation between): the
  # statistic is one over both axes of the buffer, 256 elements each.
  f = _summed("8,16,32", "16", """\
  %r1 = f32[8,16]{1,0} reduce(%p0, %z), dimensions={2}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  %n = f32[8,16]{1,0} negate(%r1), metadata={op_name="jit(f)/neg"}
  ROOT %r = f32[16]{0} reduce(%n, %z), dimensions={0}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}""")
  assert "reduces dims {0,2} of [8,16,32] (256 elements each)" in f.evidence
  assert "one result per index of axes {1}" in f.evidence


def test_a_sum_of_everything_through_a_reshape_names_every_axis_of_the_buffer():
  # The reduce reads [128,64], a bitcast of the written [8,16,64]: its axes
  # {0,1} (all of them) are all three of the buffer's.
  f = _summed("8,16,64", "", """\
  %b = f32[128,64]{1,0} bitcast(%p0)
  ROOT %r = f32[] reduce(%b, %z), dimensions={0,1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}""")
  assert "reduces dims {0,1,2} of [8,16,64] (8192 elements each)" in f.evidence


# A gemm whose kernel also sums its own result (XLA's output fusion) reading
# an elementwise producer's buffer.
GEMM_THAT_SUMS = """
HloModule dr, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p0: f32[128,256]) -> f32[128,256] {
  %p0 = f32[128,256]{1,0} parameter(0)
  ROOT %e = f32[128,256]{1,0} exponential(%p0)
}

%fused_dot_sum (p0: f32[128,256], p1: f32[256,512]) -> f32[128] {
  %p0 = f32[128,256]{1,0} parameter(0)
  %p1 = f32[256,512]{1,0} parameter(1)
  %d = f32[128,512]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %z = f32[] constant(0)
  ROOT %r = f32[128]{0} reduce(%d, %z), dimensions={1}, to_apply=%add
}

ENTRY %main (x: f32[128,256], w: f32[256,512]) -> f32[128] {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %ex = f32[128,256]{1,0} fusion(%x), kind=kLoop, calls=%fused_exp
  ROOT %g = f32[128]{0} fusion(%ex, %w), kind=kOutput, calls=%fused_dot_sum
}
"""


def test_a_gemm_summing_its_own_result_is_no_reduction_of_its_operands():
  report = hlo_audit.audit_hlo(GEMM_THAT_SUMS)
  assert not report.findings_of(FindingKind.SEPARATE_REDUCTION)
  (pro,) = report.findings_of(FindingKind.UNFUSED_PROLOGUE)
  assert (pro.boundary, pro.consumers) == ("ex", ("g",))
  assert not any("separate reduction" in n for n in pro.notes), pro.notes


# One kernel sums the written buffer over its rows and, beside it, a
# parameter over everything.
TWO_SUMS = """
HloModule ts, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  ROOT %e = f32[64,128]{1,0} exponential(%p0), metadata={op_name="jit(f)/exp"}
}

%fused_sums (p0: f32[64,128], p1: f32[64,128]) -> (f32[64], f32[]) {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  %z = f32[] constant(0)
  %r = f32[64]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  %all = f32[] reduce(%p1, %z), dimensions={0,1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %t = (f32[64]{0}, f32[]) tuple(%r, %all)
}

ENTRY %main (x: f32[64,128], y: f32[64,128]) -> (f32[64], f32[]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} parameter(1)
  %ex = f32[64,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_exp, metadata={op_name="jit(f)/exp"}
  ROOT %s = (f32[64]{0}, f32[]) fusion(%ex, %y), kind=kInput, calls=%fused_sums, metadata={op_name="jit(f)/reduce_sum"}
}
"""


def test_the_statistics_are_those_of_the_reduce_reading_the_buffer():
  # The wider sum over everything reads the parameter, not the buffer.
  (f,) = hlo_audit.audit_hlo(TWO_SUMS).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.boundary == "ex"
  assert "reduces dims {1} of [64,128] (128 elements each)" in f.evidence
  assert "one result per index of axes {0}" in f.evidence


# A reduce XLA left unfused (a top-level instruction, as XLA wrote a single
# op before it wrapped single ops in fusions, and as hand-written modules
# do) reading a loop fusion's buffer, which is also an output.
UNFUSED_SUM = """
HloModule us, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  ROOT %e = f32[64,128]{1,0} exponential(%p0), metadata={op_name="jit(f)/exp"}
}

ENTRY %main (x: f32[64,128]) -> (f32[64,128], f32[64]) {
  %x = f32[64,128]{1,0} parameter(0)
  %ex = f32[64,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_exp, metadata={op_name="jit(f)/exp"}
  %z = f32[] constant(0)
  %sum = f32[64]{0} reduce(%ex, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[64,128]{1,0}, f32[64]{0}) tuple(%ex, %sum)
}
"""


def test_an_unfused_reduce_is_a_separate_reduction():
  (f,) = hlo_audit.audit_hlo(UNFUSED_SUM).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert (f.boundary, f.consumers) == ("ex", ("sum",))
  assert "reduces dims {1} of [64,128] (128 elements each)" in f.evidence


# jax-md's cell list as XLA writes it: one kernel hashes the particles'
# cells, another gathers the table's rows at those hashes and sums their
# squares (the candidates' squared distances).
GATHERED = """
HloModule gathered, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_hash (p0: f32[64,4]) -> s32[64,4] {
  %p0 = f32[64,4]{1,0} parameter(0)
  %k = f32[] constant(0.25)
  %kb = f32[64,4]{1,0} broadcast(%k), dimensions={}
  %m = f32[64,4]{1,0} multiply(%p0, %kb), metadata={op_name="jit(f)/mul"}
  %fl = f32[64,4]{1,0} floor(%m), metadata={op_name="jit(f)/floor"}
  ROOT %h = s32[64,4]{1,0} convert(%fl), metadata={op_name="jit(f)/convert_element_type"}
}

%fused_table (p0: f32[256,2]) -> f32[256,2] {
  %p0 = f32[256,2]{1,0} parameter(0)
  ROOT %e = f32[256,2]{1,0} exponential(%p0), metadata={op_name="jit(f)/exp"}
}

%fused_sum (p0: f32[256,2], p1: s32[64,4]) -> f32[256] {
  %p1 = s32[64,4]{1,0} parameter(1)
  %idx = s32[256,1]{1,0} bitcast(%p1)
  %p0 = f32[256,2]{1,0} parameter(0)
  %g = f32[256,1,2]{2,1,0} gather(%p0, %idx), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2}
  %gb = f32[256,2]{1,0} bitcast(%g)
  %sq = f32[256,2]{1,0} multiply(%gb, %gb)
  %z = f32[] constant(0)
  ROOT %r = f32[256]{0} reduce(%sq, %z), dimensions={1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
}

ENTRY %main (x: f32[64,4], t: f32[256,2]) -> f32[256] {
  %x = f32[64,4]{1,0} parameter(0)
  %t = f32[256,2]{1,0} parameter(1)
  %hash = s32[64,4]{1,0} fusion(%x), kind=kLoop, calls=%fused_hash, metadata={op_name="jit(f)/convert_element_type"}
  %table = f32[256,2]{1,0} fusion(%t), kind=kLoop, calls=%fused_table, metadata={op_name="jit(f)/exp"}
  ROOT %sum = f32[256]{0} fusion(%table, %hash), kind=kInput, calls=%fused_sum, metadata={op_name="jit(f)/reduce_sum"}
}
"""


def test_gather_indices_are_not_what_a_reduction_sums():
  # The gathered rows are reduced (their producer could sum them); the
  # hashes only say where to read.
  report = hlo_audit.audit_hlo(GATHERED, options=hlo_audit.AuditOptions(min_bytes_saved=0))
  (f,) = report.findings_of(FindingKind.SEPARATE_REDUCTION)
  assert (f.boundary, f.consumers) == ("table", ("sum",))
  assert not [f for f in report.findings if f.boundary == "hash"]


# jnp.cumsum's last stage as XLA:GPU writes it: the 3 block totals (the
# last column of each block) summed into 4 prefixes by a reduce-window
# padded longer than its operand.
PREFIX = """
HloModule prefix, is_scheduled=true

%add (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}

%fused_blocks (p0: s32[3,16]) -> s32[3,16] {
  %p0 = s32[3,16]{1,0} parameter(0)
  ROOT %m = s32[3,16]{1,0} multiply(%p0, %p0), metadata={op_name="jit(f)/mul"}
}

%fused_prefix (p0: s32[3,16]) -> s32[4,1] {
  %p0 = s32[3,16]{1,0} parameter(0)
  %last = s32[3,1]{1,0} slice(%p0), slice={[0:3], [15:16]}
  %z = s32[] constant(0)
  ROOT %rw = s32[4,1]{1,0} reduce-window(%last, %z), window={size=3x1 pad=3_0x0_0}, to_apply=%add
}

ENTRY %main (x: s32[3,16]) -> s32[4,1] {
  %x = s32[3,16]{1,0} parameter(0)
  %blocks = s32[3,16]{1,0} fusion(%x), kind=kLoop, calls=%fused_blocks, metadata={op_name="jit(f)/mul"}
  ROOT %pre = s32[4,1]{1,0} fusion(%blocks), kind=kLoop, calls=%fused_prefix, metadata={op_name="jit(f)/cumsum"}
}
"""


def test_a_window_padded_longer_than_its_operand_is_a_prefix_sum():
  every = hlo_audit.AuditOptions(min_bytes_saved=0)  # (a few hundred bytes)
  assert not hlo_audit.audit_hlo(PREFIX, options=every).findings_of(
      FindingKind.SEPARATE_REDUCTION)
  # Unpadded, the window sums the 3 totals into one: a reduction.
  summed = PREFIX.replace("s32[4,1]", "s32[1,1]").replace("pad=3_0x0_0", "pad=0_0x0_0")
  (f,) = hlo_audit.audit_hlo(summed, options=every).findings_of(
      FindingKind.SEPARATE_REDUCTION)
  assert f.boundary == "blocks"


# A kernel writing zeros beside its result (XLA's CSE of one zero
# broadcast: a scatter-add's destination), read by a reduction only where
# that zero is compared with.
ZEROS_BESIDE = """
HloModule zeros, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_step (p0: f32[1000,2]) -> (f32[1000,2], f32[1000,2]) {
  %p0 = f32[1000,2]{1,0} parameter(0)
  %e = f32[1000,2]{1,0} exponential(%p0), metadata={op_name="jit(f)/exp"}
  %c = f32[] constant(0)
  SECOND
  ROOT %o = (f32[1000,2]{1,0}, f32[1000,2]{1,0}) tuple(%e, %zeros)
}

%fused_check (p0: f32[1000,2], p1: f32[1000,2]) -> f32[] {
  %p0 = f32[1000,2]{1,0} parameter(0)
  %p1 = f32[1000,2]{1,0} parameter(1)
  %lt = pred[1000,2]{1,0} compare(%p1, %p0), direction=LT
  %n = f32[1000,2]{1,0} negate(%p1)
  %s = f32[1000,2]{1,0} select(%lt, %n, %p1)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%s, %z), dimensions={0,1}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
}

ENTRY %main (x: f32[1000,2], y: f32[1000,2]) -> (f32[1000,2], f32[]) {
  %x = f32[1000,2]{1,0} parameter(0)
  %y = f32[1000,2]{1,0} parameter(1)
  %step = (f32[1000,2]{1,0}, f32[1000,2]{1,0}) fusion(%x), kind=kLoop, calls=%fused_step, metadata={op_name="jit(f)/exp"}
  %zeros = f32[1000,2]{1,0} get-tuple-element(%step), index=1
  %e = f32[1000,2]{1,0} get-tuple-element(%step), index=0
  %check = f32[] fusion(%zeros, %y), kind=kInput, calls=%fused_check, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %out = (f32[1000,2]{1,0}, f32[]) tuple(%e, %check)
}
"""


def test_a_constant_written_beside_a_result_holds_nothing_to_reduce():
  zeros = ZEROS_BESIDE.replace(
      "SECOND", "%zeros = f32[1000,2]{1,0} broadcast(%c), dimensions={}")
  # (The expanded broadcast is its finding, with no reduction noted on it.)
  (wide,) = hlo_audit.audit_hlo(zeros).findings_of(FindingKind.EXPANDED_BROADCAST)
  assert wide.boundary == "step{1}" and not wide.notes, wide.notes
  # Data written beside it is what the reduction could take from its kernel.
  data = ZEROS_BESIDE.replace("SECOND", "%zeros = f32[1000,2]{1,0} negate(%p0)")
  (f,) = hlo_audit.audit_hlo(data).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.boundary == "step{1}"


# A softmax over two trailing axes (`axis=(-2, -1)`): the row max, then
# one kernel writes exp(x - max) beside its sum over both axes, and the
# divide reads the two.
SOFTMAX_2D = """
HloModule sm2, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_max (p0: f32[8,16,32]) -> f32[8] {
  %p0 = f32[8,16,32]{2,1,0} parameter(0)
  %ninf = f32[] constant(-inf)
  ROOT %m = f32[8]{0} reduce(%p0, %ninf), dimensions={1,2}, to_apply=%max, metadata={op_name="jit(f)/reduce_max"}
}

%fused_exp_sum (p0: f32[8,16,32], p1: f32[8]) -> (f32[8], f32[8,16,32]) {
  %p0 = f32[8,16,32]{2,1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %b = f32[8,16,32]{2,1,0} broadcast(%p1), dimensions={0}
  %d = f32[8,16,32]{2,1,0} subtract(%p0, %b), metadata={op_name="jit(f)/sub"}
  %e = f32[8,16,32]{2,1,0} exponential(%d), metadata={op_name="jit(f)/exp"}
  %z = f32[] constant(0)
  %s = f32[8]{0} reduce(%e, %z), dimensions={1,2}, to_apply=%add, metadata={op_name="jit(f)/reduce_sum"}
  ROOT %t = (f32[8]{0}, f32[8,16,32]{2,1,0}) tuple(%s, %e)
}

%fused_div (p0: f32[8,16,32], p1: f32[8]) -> f32[8,16,32] {
  %p0 = f32[8,16,32]{2,1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %b = f32[8,16,32]{2,1,0} broadcast(%p1), dimensions={0}
  ROOT %q = f32[8,16,32]{2,1,0} divide(%p0, %b), metadata={op_name="jit(f)/div"}
}

ENTRY %main (x: f32[8,16,32]) -> f32[8,16,32] {
  %x = f32[8,16,32]{2,1,0} parameter(0)
  %m = f32[8]{0} fusion(%x), kind=kInput, calls=%fused_max, metadata={op_name="jit(f)/reduce_max"}
  %es = (f32[8]{0}, f32[8,16,32]{2,1,0}) fusion(%x, %m), kind=kInput, calls=%fused_exp_sum, metadata={op_name="jit(f)/reduce_sum"}
  %s = f32[8]{0} get-tuple-element(%es), index=0
  %e = f32[8,16,32]{2,1,0} get-tuple-element(%es), index=1
  ROOT %p = f32[8,16,32]{2,1,0} fusion(%e, %s), kind=kLoop, calls=%fused_div, metadata={op_name="jit(f)/div"}
}
"""


def test_rows_written_beside_a_sum_over_two_trailing_axes_are_a_softmax_kernels():
  (f,) = hlo_audit.audit_hlo(SOFTMAX_2D).findings_of(FindingKind.SEPARATE_REDUCTION)
  assert (f.boundary, f.ops, f.consumers) == ("es{1}", ("softmax",), ("p",))
  assert "beside its row reduction es{0} (f32[8], 512 elements a row)" in f.evidence
  # The rows' write and their read by the divide go.
  assert f.bytes_saved == 2 * 8 * 16 * 32 * 4

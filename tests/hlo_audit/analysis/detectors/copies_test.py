"""Standalone copies whose result is the program's output, on XLA:CPU: what
the record says reads them, and when narrowing is a change of numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind, NumericalClass

S = jax.ShapeDtypeStruct


def _copy(fn) -> hlo_audit.FusionDecisionRecord:
  report = hlo_audit.audit(jax.jit(fn), S((256, 512), jnp.float32))
  (copy,) = report.findings_of(FindingKind.STANDALONE_COPY)
  return copy


def test_a_transpose_into_the_output_is_read_by_the_programs_output():
  copy = _copy(lambda x: x.T)
  assert copy.consumers == ()
  assert copy.evidence.endswith("of f32[512,256] written to memory and read by the "
                                "program's output"), copy.evidence


def test_narrowing_into_the_output_drops_no_rounding():
  # f32 -> bf16 in the copy, and nothing widens it back: removing the copy
  # keeps the one rounding the program asked for.
  copy = _copy(lambda x: x.T.astype(jnp.bfloat16))
  assert copy.boundary_shape == "bf16[512,256]"
  assert copy.numerical_class is NumericalClass.EXACT
  assert "round trip" not in copy.evidence and not any(
      "rounds" in r for r in copy.reasons), copy


ROUND_TRIP = """
HloModule rt, is_scheduled=true

%fused_narrow (p0: f32[256,512]) -> bf16[256,512] {
  %p0 = f32[256,512]{1,0} parameter(0)
  ROOT %n = bf16[256,512]{1,0} convert(%p0)
}

%fused_reader (p0: bf16[256,512]) -> f32[256,512] {
  %p0 = bf16[256,512]{1,0} parameter(0)
  BODY
}

ENTRY %main (x: f32[256,512]) -> f32[256,512] {
  %x = f32[256,512]{1,0} parameter(0)
  %c = bf16[256,512]{1,0} fusion(%x), kind=kLoop, calls=%fused_narrow
  ROOT %f = f32[256,512]{1,0} fusion(%c), kind=kLoop, calls=%fused_reader
}
"""
WIDEN = "ROOT %w = f32[256,512]{1,0} convert(%p0)"
WIDEN_THEN_EXP = ("%w = f32[256,512]{1,0} convert(%p0)\n"
                  "  ROOT %e = f32[256,512]{1,0} exponential(%w)")
EXP_THEN_WIDEN = ("%e = bf16[256,512]{1,0} exponential(%p0)\n"
                  "  ROOT %w = f32[256,512]{1,0} convert(%e)")


def _narrowing(body: str) -> hlo_audit.FusionDecisionRecord:
  report = hlo_audit.audit_hlo(ROUND_TRIP.replace("BODY", body))
  (c,) = [f for f in report.findings_of(FindingKind.STANDALONE_COPY) if f.boundary == "c"]
  assert c.consumers == ("f",)
  # The root computes from c: c is read, not returned (no output copy).
  assert "output copy" not in " ".join(c.ops) + c.evidence, c
  return c


def test_a_narrowing_kernel_is_a_round_trip_only_where_its_reader_converts_back():
  # A reader doing nothing but widen it back: a round trip whose removal
  # removes the rounding the program asked for.
  trip = _narrowing(WIDEN)
  assert trip.ops == ("convert round trip",)
  assert trip.numerical_class is NumericalClass.PRECISION_CHANGE
  # A reader widening it on load to compute: a conversion of its own, whose
  # removal still drops the bf16 rounding.
  on_load = _narrowing(WIDEN_THEN_EXP)
  assert on_load.ops == ("dtype conversion",)
  assert on_load.numerical_class is NumericalClass.PRECISION_CHANGE
  assert "f32 -> bf16 -> f32" in on_load.evidence
  # A reader computing in bf16 and widening its own result: fusing the
  # conversion into it rounds the same values.
  in_bf16 = _narrowing(EXP_THEN_WIDEN)
  assert in_bf16.ops == ("dtype conversion",)
  assert in_bf16.numerical_class is NumericalClass.EXACT
  assert "round trip" not in in_bf16.evidence


PERMUTING_COPY = """
HloModule tr, is_scheduled=true

%fused_t (p0: f32[256,512]) -> f32[512,256] {
  %p0 = f32[256,512]{1,0} parameter(0)
  %b = f32[512,256]{0,1} bitcast(%p0)
  ROOT %c = f32[512,256]{1,0} copy(%b)
}

ENTRY %main (x: f32[256,512]) -> f32[512,256] {
  %x = f32[256,512]{1,0} parameter(0)
  %y = f32[256,512]{1,0} exponential(%x)
  %t = f32[512,256]{1,0} fusion(%y), kind=kLoop, calls=%fused_t
  ROOT %e = f32[512,256]{1,0} tanh(%t)
}
"""


def test_a_transpose_between_bitcasts_names_the_layouts_inside_the_fusion():
  # Both ends of the kernel are {1,0}: the move is the copy inside, from
  # the bitcast's {0,1}.
  (t,) = hlo_audit.audit_hlo(PERMUTING_COPY).findings_of(FindingKind.STANDALONE_COPY)
  assert (t.boundary, t.ops, t.consumers) == ("t", ("layout change",), ("e",))
  assert "a layout change {0,1} -> {1,0} of f32[512,256]" in t.evidence, t.evidence
  assert t.layout_effect == "consumers read {0,1} directly instead of the {1,0} copy"


# A while body whose new carry element is copied into the loop state at its
# end (XLA does so where the value it is computed from shares the old
# carry's buffer): the copy writes the loop-state buffer, which its initial
# copy defined first.
LOOP_EXIT_COPY = """
HloModule loop, is_scheduled=true

%cond (p: (s32[], f32[256,128], f32[256,128])) -> pred[] {
  %p = (s32[], f32[256,128]{1,0}, f32[256,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%fused_step (p0: f32[256,128], p1: f32[256,128]) -> (f32[256,128], f32[256,128]) {
  %p0 = f32[256,128]{1,0} parameter(0)
  %p1 = f32[256,128]{1,0} parameter(1)
  %e = f32[256,128]{1,0} exponential(%p0)
  %t = f32[256,128]{1,0} add(%p0, %p1)
  ROOT %o = (f32[256,128]{1,0}, f32[256,128]{1,0}) tuple(%e, %t)
}

%body (p: (s32[], f32[256,128], f32[256,128])) -> (s32[], f32[256,128], f32[256,128]) {
  %p = (s32[], f32[256,128]{1,0}, f32[256,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[256,128]{1,0} get-tuple-element(%p), index=1
  %v = f32[256,128]{1,0} get-tuple-element(%p), index=2
  %f = (f32[256,128]{1,0}, f32[256,128]{1,0}) fusion(%x, %v), kind=kLoop, calls=%fused_step, metadata={op_name="jit(f)/while/body/exp"}
  %a = f32[256,128]{1,0} get-tuple-element(%f), index=0
  %b = f32[256,128]{1,0} get-tuple-element(%f), index=1
  %c = f32[256,128]{1,0} copy(%b)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[256,128]{1,0}, f32[256,128]{1,0}) tuple(%j, %a, %c)
}

ENTRY %main (x: f32[256,128], v: f32[256,128]) -> (s32[], f32[256,128], f32[256,128]) {
  %x = f32[256,128]{1,0} parameter(0)
  %v = f32[256,128]{1,0} parameter(1)
  %x0 = f32[256,128]{1,0} copy(%x)
  %v0 = f32[256,128]{1,0} copy(%v)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256,128]{1,0}, f32[256,128]{1,0}) tuple(%zero, %x0, %v0)
  ROOT %w = (s32[], f32[256,128]{1,0}, f32[256,128]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
}
"""


def test_a_copy_into_the_loop_state_at_the_bodys_end_is_a_standalone_copy():
  report = hlo_audit.audit_hlo(LOOP_EXIT_COPY)
  (copy,) = [f for f in report.findings_of(FindingKind.STANDALONE_COPY) if f.boundary == "c"]
  assert copy.ops == ("loop-carry copy (body exit)",)
  assert copy.bytes_saved == 2 * 256 * 128 * 4 * 10  # every trip
  # The loop state stays: the copy's traffic goes, not the buffer.
  assert copy.boundary_kept and copy.peak_saved == 0


# A decode step's value cache [layers, b, t, h, d] in bf16: XLA:CPU (jax
# 0.10) widens it, cuts layer 0 out, rounds and widens it again (the bf16
# operand of an f32 dot) and transposes it to [b, h, t, d], only for p @ v.
CACHE_READ = """
HloModule cache, is_scheduled=true

%fused_cut (p0: CT[2,4,256,2,32]) -> f32[4,2,256,32] {
  %p0 = CT[2,4,256,2,32]{CL} parameter(0)
  %w = f32[2,4,256,2,32]{4,3,2,1,0} convert(%p0)
  %s = f32[1,4,256,2,32]{4,3,2,1,0} slice(%w), slice={[0:1], [0:4], [0:256], [0:2], [0:32]}
  %n = bf16[1,4,256,2,32]{4,3,2,1,0} convert(%s)
  %r = f32[1,4,256,2,32]{4,3,2,1,0} convert(%n)
  %b = f32[4,256,2,32]{3,2,1,0} bitcast(%r)
  %t = f32[4,2,256,32]{3,1,2,0} transpose(%b), dimensions={0,2,1,3}
  ROOT %c = f32[4,2,256,32]{3,2,1,0} copy(%t)
}

ENTRY %main (cache: CT[2,4,256,2,32], p: f32[4,2,4,256]) -> f32[4,2,4,32] {
  %cache = CT[2,4,256,2,32]{CL} parameter(0)
  %p = f32[4,2,4,256]{3,2,1,0} parameter(1)
  %v = f32[4,2,256,32]{3,2,1,0} fusion(%cache), kind=kLoop, calls=%fused_cut
  ROOT %o = f32[4,2,4,32]{3,2,1,0} dot(%p, %v), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
}
"""


def _cache_read(dtype: str, layout: str = "4,3,2,1,0") -> str:
  return CACHE_READ.replace("CT[", f"{dtype}[").replace("{CL}", f"{{{layout}}}")


def test_a_part_cut_out_and_transposed_for_a_matmul_is_a_layout_conflict():
  # The dot could read the layer in the cache's own layout at its offset.
  (lc,) = hlo_audit.audit_hlo(_cache_read("bf16")).findings_of(FindingKind.LAYOUT_CONFLICT)
  assert (lc.boundary, lc.ops) == ("v", ("transpose",))
  # The values came in as bf16: rounding them to bf16 again rounds nothing.
  assert lc.numerical_class is NumericalClass.EXACT, lc.evidence
  # From an f32 cache the rounding is the program's: dropping it is not exact.
  (lc,) = hlo_audit.audit_hlo(_cache_read("f32")).findings_of(FindingKind.LAYOUT_CONFLICT)
  assert lc.numerical_class is NumericalClass.PRECISION_CHANGE
  assert "f32 -> bf16 -> f32" in lc.evidence


def test_a_part_cut_out_of_a_cache_laid_out_heads_major_is_not_reordered():
  # The cache's memory is already [layers, b, h, t, d]: the logical
  # transpose writes the layer in the order it lies in, a contiguous cut.
  report = hlo_audit.audit_hlo(_cache_read("bf16", "4,2,3,1,0"))
  assert not report.findings_of(FindingKind.LAYOUT_CONFLICT)
  assert not report.findings_of(FindingKind.STANDALONE_COPY)


# A scan's time-major output [t, b, h] transposed to batch-major and one
# step cut out of it (XLA fuses the transpose with the slice), for a dot.
STEP_READ = """
HloModule step, is_scheduled=true

%fused_step (p0: f32[32,16,128]) -> f32[16,128] {
  %p0 = f32[32,16,128]{2,1,0} parameter(0)
  %t = f32[16,32,128]{2,0,1} transpose(%p0), dimensions={1,0,2}
  %c = f32[16,32,128]{2,1,0} copy(%t)
  %s = f32[16,1,128]{2,1,0} slice(%c), slice={[0:16], [CUT], [0:128]}
  ROOT %b = f32[16,128]{1,0} bitcast(%s)
}

ENTRY %main (ys: f32[32,16,128], w: f32[128,4]) -> f32[16,4] {
  %ys = f32[32,16,128]{2,1,0} parameter(0)
  %w = f32[128,4]{1,0} parameter(1)
  %last = f32[16,128]{1,0} fusion(%ys), kind=kLoop, calls=%fused_step
  ROOT %o = f32[16,4]{1,0} dot(%last, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_one_step_cut_out_of_a_transposed_time_major_array_is_no_layout_change():
  # The last step is one contiguous row of the time-major array: the
  # transpose inside the kernel reorders nothing that survives the cut.
  report = hlo_audit.audit_hlo(STEP_READ.replace("[CUT]", "[31:32]"))
  assert not report.findings_of(FindingKind.LAYOUT_CONFLICT)
  assert not report.findings_of(FindingKind.STANDALONE_COPY)


def test_a_strided_cut_keeps_the_element_order():
  # Every other batch row of one step: strided in the source, still in its
  # order.
  hlo = STEP_READ.replace("[CUT]", "[31:32]").replace("[0:16], [31:32]", "[0:16:2], [31:32]") \
      .replace("f32[16,1,128]{2,1,0} slice", "f32[8,1,128]{2,1,0} slice") \
      .replace("-> f32[16,128] {", "-> f32[8,128] {") \
      .replace("ROOT %b = f32[16,128]", "ROOT %b = f32[8,128]") \
      .replace("%last = f32[16,128]", "%last = f32[8,128]") \
      .replace("-> f32[16,4] {", "-> f32[8,4] {").replace("ROOT %o = f32[16,4]", "ROOT %o = f32[8,4]")
  report = hlo_audit.audit_hlo(hlo)
  assert not report.findings_of(FindingKind.LAYOUT_CONFLICT)

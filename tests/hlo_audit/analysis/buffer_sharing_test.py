"""XLA:GPU's buffer-sharing rules against the default (CPU) ones, on
hand-written modules whose answers follow from XLA's code
(`xla/service/gpu/buffer_sharing.cc`, `HloDataflowAnalysis::CanShareBuffer`)."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit._src.analysis.buffer_sharing import (can_share_buffer, gpu_can_share_buffer,
                                                    heap_model, infer_platform)


def _ask(text: str, user: str, operand_number: int, user_index=(), operand_index=()):
  m = hlo_audit.parse_hlo(text)
  comp = m.entry
  inst = comp.instruction(user)
  return (gpu_can_share_buffer(m, comp, inst, operand_number, operand_index, user_index),
          can_share_buffer(m, comp, inst, operand_number, operand_index, user_index))


GEMM_EPILOGUE = """
HloModule m, is_scheduled=true
%gemm (p0: f32[64,32], p1: f32[32,128], p2: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,32]{1,0} parameter(0)
  %p1 = f32[32,128]{1,0} parameter(1)
  %p2 = f32[64,128]{1,0} parameter(2)
  %dot = f32[64,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %add = f32[64,128]{1,0} add(%dot, %p2)
}
ENTRY %main (a: f32[64,32], b: f32[32,128], r: f32[64,128]) -> f32[64,128] {
  %a = f32[64,32]{1,0} parameter(0)
  %b = f32[32,128]{1,0} parameter(1)
  %r = f32[64,128]{1,0} parameter(2)
  %res = f32[64,128]{1,0} exponential(%r)
  ROOT %f = f32[64,128]{1,0} fusion(%a, %b, %res), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
}
"""


def test_a_triton_gemm_writes_over_its_residual_on_the_gpu_only():
  # The residual reaches the output through the epilogue's add alone.
  assert _ask(GEMM_EPILOGUE, "f", 2) == (True, False)
  # An operand of the dot is read whole for every output tile.
  assert _ask(GEMM_EPILOGUE, "f", 0) == (False, False)


RESHAPED = """
HloModule m, is_scheduled=true
%fused (p0: f32[8,16]) -> f32[128] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %e = f32[8,16]{1,0} exponential(%p0)
  ROOT %b = f32[128]{0} bitcast(%e)
}
%fused_bcast (p0: f32[8,16]) -> f32[8,16] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %t = f32[16,8]{0,1} transpose(%p0), dimensions={1,0}
  ROOT %b = f32[8,16]{1,0} bitcast(%t)
}
%fused_half (p0: f32[8,16]) -> f16[128] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %c = f16[8,16]{1,0} convert(%p0)
  ROOT %b = f16[128]{0} bitcast(%c)
}
ENTRY %main (x: f32[8,16]) -> (f32[128], f32[8,16], f16[128]) {
  %x = f32[8,16]{1,0} parameter(0)
  %y = f32[8,16]{1,0} negate(%x)
  %f = f32[128]{0} fusion(%y), kind=kLoop, calls=%fused
  %g = f32[8,16]{1,0} fusion(%y), kind=kLoop, calls=%fused_bcast
  %h = f16[128]{0} fusion(%y), kind=kLoop, calls=%fused_half
  ROOT %t = (f32[128]{0}, f32[8,16]{1,0}, f16[128]{0}) tuple(%f, %g, %h)
}
"""


def test_the_same_element_count_in_another_shape_may_share_on_the_gpu():
  assert _ask(RESHAPED, "f", 0) == (True, False)
  # A transpose reads out of order: never in place.
  assert _ask(RESHAPED, "g", 0) == (False, False)
  # Other element size: never.
  assert _ask(RESHAPED, "h", 0) == (False, False)


MULTI_OUTPUT = """
HloModule m, is_scheduled=true
%fused (p0: f32[256], p1: f32[256]) -> (f32[256], f32[256]) {
  %p0 = f32[256]{0} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  %m = f32[256]{0} multiply(%p0, %p1)
  %a = f32[256]{0} add(%p0, %p1)
  ROOT %t = (f32[256]{0}, f32[256]{0}) tuple(%m, %a)
}
ENTRY %main (x: f32[256], y: f32[256]) -> (f32[256], f32[256]) {
  %x = f32[256]{0} parameter(0)
  %y = f32[256]{0} parameter(1)
  %g = f32[256]{0} exponential(%y)
  ROOT %f = (f32[256]{0}, f32[256]{0}) fusion(%x, %g), kind=kLoop, calls=%fused
}
"""


COPIED = """
HloModule m, is_scheduled=true
%fused_copy (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %c = f32[64,128]{0,1} copy(%p0)
  ROOT %e = f32[64,128]{0,1} exponential(%c)
}
%fused_exp (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %n = f32[64,128]{1,0} negate(%p0)
  ROOT %e = f32[64,128]{1,0} exponential(%n)
}
ENTRY %main (x: f32[64,128]) -> (f32[64,128], f32[64,128]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} negate(%x)
  %f = f32[64,128]{0,1} fusion(%y), kind=kLoop, calls=%fused_copy
  %z = f32[64,128]{1,0} negate(%x)
  %g = f32[64,128]{1,0} fusion(%z), kind=kLoop, calls=%fused_exp
  ROOT %t = (f32[64,128]{0,1}, f32[64,128]{1,0}) tuple(%f, %g)
}
"""


def test_a_fused_copy_keeps_its_operand_apart_on_the_gpu():
  # A copy is elementwise on its operand, but it may change the layout: XLA:GPU
  # lets no output take the memory of a parameter a copy reads, even where
  # element count and size agree (the layouts here differ).
  assert _ask(COPIED, "f", 0)[0] is False
  # The same chain without the copy writes in place.
  assert _ask(COPIED, "g", 0) == (True, True)


def test_one_output_of_a_multi_output_fusion_may_take_an_array_operand():
  # The operand value sits at index (), the output at (1,): XLA asks with both.
  assert _ask(MULTI_OUTPUT, "f", 1, user_index=(1,)) == (True, False)
  assert _ask(MULTI_OUTPUT, "f", 1, user_index=(0,)) == (True, False)


REDUCTION = """
HloModule m, is_scheduled=true
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%fused (p0: f32[32,64]) -> (f32[32], f32[32,64]) {
  %p0 = f32[32,64]{1,0} parameter(0)
  %z = f32[] constant(0)
  %r = f32[32]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add
  %e = f32[32,64]{1,0} exponential(%p0)
  ROOT %t = (f32[32]{0}, f32[32,64]{1,0}) tuple(%r, %e)
}
ENTRY %main (x: f32[32,64]) -> (f32[32], f32[32,64]) {
  %x = f32[32,64]{1,0} parameter(0)
  %y = f32[32,64]{1,0} negate(%x)
  ROOT %f = (f32[32]{0}, f32[32,64]{1,0}) fusion(%y), kind=kInput, calls=%fused
}
"""


def test_a_reduction_fusion_computes_its_hero_first():
  assert _ask(REDUCTION, "f", 0, user_index=(1,))[0] is True


LIBRARY = """
HloModule m, is_scheduled=true
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main (x: f32[64,64], w: f32[64,64], c: f32[64,64]) -> (f32[64,64], s8[4096]) {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[64,64]{1,0} parameter(1)
  %c = f32[64,64]{1,0} parameter(2)
  %r = f32[64,64]{1,0} all-reduce(%x), replica_groups={}, to_apply=%add
  %lt = (f32[64,64]{1,0}, s8[4096]{0}) custom-call(%x, %w, %c), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":1}}
  %lt0 = (f32[64,64]{1,0}, s8[4096]{0}) custom-call(%x, %w, %c), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0}}
  ROOT %t = (f32[64,64]{1,0}, s8[4096]{0}) tuple(%r, %w)
}
"""


def test_gpu_library_calls_and_collectives_in_place():
  assert _ask(LIBRARY, "r", 0)[0] is True  # NCCL all-reduce
  # cuBLASLt overwrites its bias operand when beta != 0.
  assert _ask(LIBRARY, "lt", 2, user_index=(0,))[0] is True
  assert _ask(LIBRARY, "lt0", 2, user_index=(0,))[0] is False
  assert _ask(LIBRARY, "lt", 0, user_index=(0,))[0] is False


def test_the_platform_picks_the_rule_and_gpu_hlo_is_recognised():
  assert heap_model("gpu").packing_alignment == 256
  assert heap_model("cpu").packing_alignment is None and heap_model("").can_share \
      is can_share_buffer
  assert infer_platform(hlo_audit.parse_hlo(GEMM_EPILOGUE)) == "gpu"
  assert infer_platform(hlo_audit.parse_hlo(RESHAPED)) == ""


@pytest.mark.parametrize("text", [GEMM_EPILOGUE, RESHAPED, MULTI_OUTPUT])
def test_gpu_rules_never_share_a_constant(text):
  m = hlo_audit.parse_hlo(text.replace("%y = f32[8,16]{1,0} negate(%x)",
                                       "%y = f32[8,16]{1,0} constant({...})"))
  comp = m.entry
  for inst in comp.instructions:
    for k, o in enumerate(inst.operands):
      if comp.instruction(o).opcode == "constant":
        assert not gpu_can_share_buffer(m, comp, inst, k, (), ())


SOLVER = """
HloModule m, is_scheduled=true
ENTRY %main (a: f32[64,64]) -> (f32[64,64], s32[]) {
  %a = f32[64,64]{1,0} parameter(0)
  %x = f32[64,64]{1,0} exponential(%a)
  %ch = (f32[64,64]{1,0}, s32[]) custom-call(%x), custom_call_target="__cusolver$cholesky"
  ROOT %other = (f32[64,64]{1,0}, s32[]) custom-call(%x), custom_call_target="my_library$op"
}
"""


def test_cusolvers_cholesky_factors_in_place_and_other_calls_do_not():
  # cuSOLVER writes the factor (output 0) over its input; its info word, and
  # any other library's outputs, get memory of their own.
  assert _ask(SOLVER, "ch", 0, user_index=(0,))[0] is True
  assert _ask(SOLVER, "ch", 0, user_index=(1,))[0] is False
  assert _ask(SOLVER, "other", 0, user_index=(0,))[0] is False


UPDATE_BESIDE = """
HloModule m, is_scheduled=true
%fused (p0: f32[256], p1: f32[256], p2: s32[]) -> (f32[256], f32[256]) {
  %p0 = f32[256]{0} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  %p2 = s32[] parameter(2)
  %dus = f32[256]{0} dynamic-update-slice(%p1, %p0, %p2)
  %e = f32[256]{0} exponential(%OTHER)
  ROOT %t = (f32[256]{0}, f32[256]{0}) tuple(%dus, %e)
}
ENTRY %main (x: f32[256], y: f32[256], i: s32[]) -> (f32[256], f32[256]) {
  %x = f32[256]{0} parameter(0)
  %y = f32[256]{0} parameter(1)
  %i = s32[] parameter(2)
  %g = f32[256]{0} negate(%x)
  ROOT %f = (f32[256]{0}, f32[256]{0}) fusion(%g, %y, %i), kind=kLoop, calls=%fused
}
"""


def test_an_output_not_written_elementwise_beside_another_reader_keeps_apart():
  # The update of a dynamic-update-slice may become the output it is
  # written into; but when another output of the fusion reads it too, the
  # two are not written in one order: XLA:GPU's hint refuses.
  beside = UPDATE_BESIDE.replace("%OTHER", "%p0")
  apart = UPDATE_BESIDE.replace("%OTHER", "%p1")
  assert _ask(beside, "f", 0, user_index=(0,))[0] is False
  assert _ask(apart, "f", 0, user_index=(0,))[0] is True


UPDATED_THEN_READ = """
HloModule m, is_scheduled=true
%fused (p0: f32[256], p1: f32[16], p2: s32[]) -> f32[256] {
  %p0 = f32[256]{0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %p2 = s32[] parameter(2)
  %dus = f32[256]{0} dynamic-update-slice(%p0, %p1, %p2)
  ROOT %n = f32[256]{0} negate(%dus)
}
ENTRY %main (x: f32[256], u: f32[16], i: s32[]) -> f32[256] {
  %x = f32[256]{0} parameter(0)
  %u = f32[16]{0} parameter(1)
  %i = s32[] parameter(2)
  %g = f32[256]{0} exponential(%x)
  ROOT %f = f32[256]{0} fusion(%g, %u, %i), kind=kLoop, calls=%fused
}
"""


def test_a_buffer_updated_in_a_slice_then_read_elementwise_may_become_the_output():
  # A dynamic-update-slice reads its operand 0 elementwise (each element is
  # kept or replaced in its place), so the path from the fused parameter to
  # the root stays elementwise; its update operand is read at other indices.
  assert _ask(UPDATED_THEN_READ, "f", 0)[0] is True
  # Read as the update of a slice that a later op reads: not elementwise.
  as_update = (UPDATED_THEN_READ.replace("p1: f32[16]", "p1: f32[256]")
               .replace("%p1 = f32[16]{0}", "%p1 = f32[256]{0}")
               .replace("(%p0, %p1, %p2)", "(%p1, %p0, %p2)")
               .replace("u: f32[16]", "u: f32[256]").replace("%u = f32[16]{0}", "%u = f32[256]{0}"))
  assert _ask(as_update, "f", 0)[0] is False


# Top-level ops XLA:GPU's hint leaves to the default rule: elementwise ops
# of the same shape may write over an operand, a dynamic-update-slice over
# its operand 0 only, a bitcast-convert to another element type never (not
# the same shape).
TOP_LEVEL = """
HloModule m, is_scheduled=true
ENTRY %main (a: f32[8], b: f32[8], u: f32[2], i: s32[]) -> (f32[8], f32[8], s32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %u = f32[2]{0} parameter(2)
  %i = s32[] parameter(3)
  %add = f32[8]{0} add(%a, %b)
  %dus = f32[8]{0} dynamic-update-slice(%b, %u, %i)
  %bc = s32[8]{0} bitcast-convert(%a)
  %neg = f32[8]{0} negate(%add)
  ROOT %t = (f32[8]{0}, f32[8]{0}, s32[8]{0}, f32[8]{0}) tuple(%add, %dus, %bc, %neg)
}
"""


def test_the_gpu_rule_falls_back_to_the_default_for_plain_ops():
  assert _ask(TOP_LEVEL, "add", 0) == (True, True)
  assert _ask(TOP_LEVEL, "neg", 0) == (True, True)
  assert _ask(TOP_LEVEL, "dus", 0)[0] is True
  assert _ask(TOP_LEVEL, "dus", 1)[0] is False  # the update is not the output
  assert _ask(TOP_LEVEL, "bc", 0) == (False, False)


# A fusion nested in a fused computation reads its operand as its own fused
# computation does: elementwise here (a negate), at other indices there (a
# reverse).
NESTED = """
HloModule m, is_scheduled=true
%inner (q: f32[256]) -> f32[256] {
  %q = f32[256]{0} parameter(0)
  ROOT %n = f32[256]{0} OP(%q)EXTRA
}
%fused (p0: f32[256]) -> f32[256] {
  %p0 = f32[256]{0} parameter(0)
  %e = f32[256]{0} fusion(%p0), kind=kLoop, calls=%inner
  ROOT %a = f32[256]{0} add(%e, %e)
}
ENTRY %main (x: f32[256]) -> f32[256] {
  %x = f32[256]{0} parameter(0)
  %g = f32[256]{0} exponential(%x)
  ROOT %f = f32[256]{0} fusion(%g), kind=kLoop, calls=%fused
}
"""


def test_a_nested_fusion_is_read_as_its_own_computation_reads():
  elementwise = NESTED.replace("OP", "negate").replace("EXTRA", "")
  reversed_ = NESTED.replace("OP", "reverse").replace("EXTRA", ", dimensions={0}")
  # (XLA:GPU's rule: its fusions' paths are walked op by op.)
  assert _ask(elementwise, "f", 0)[0] is True
  assert _ask(reversed_, "f", 0)[0] is False

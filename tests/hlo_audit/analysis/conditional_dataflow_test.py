"""Dataflow through a `conditional`: branch i's parameter is operand i + 1
(operand 0 is the branch index or predicate), in both of XLA's forms."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit._src.analysis.dataflow import analyze_dataflow
from hlo_audit._src.analysis.schedule import flatten_schedule

# As XLA:CPU writes a `lax.switch`: each branch reads its operand's tuple;
# %exp_fusion feeds branch 0 (sqrt), %neg_fusion branch 1 (tanh). With a
# pred[] operand XLA prints the same conditional with true_computation and
# false_computation (true is operand 1).
MODULE = """
HloModule cond, is_scheduled=true

%fused_sqrt (param_0: f32[1024]) -> f32[1024] {
  %param_0 = f32[1024]{0} parameter(0)
  ROOT %sqrt.0 = f32[1024]{0} sqrt(%param_0)
}

%branch_0 (arg0: (f32[1024])) -> (f32[1024]) {
  %arg0 = (f32[1024]{0}) parameter(0)
  %gte0 = f32[1024]{0} get-tuple-element(%arg0), index=0
  %sqrt_fusion = f32[1024]{0} fusion(%gte0), kind=kLoop, calls=%fused_sqrt
  ROOT %tuple.0 = (f32[1024]{0}) tuple(%sqrt_fusion)
}

%fused_tanh (param_0.1: f32[1024]) -> f32[1024] {
  %param_0.1 = f32[1024]{0} parameter(0)
  ROOT %tanh.0 = f32[1024]{0} tanh(%param_0.1)
}

%branch_1 (arg1: (f32[1024])) -> (f32[1024]) {
  %arg1 = (f32[1024]{0}) parameter(0)
  %gte1 = f32[1024]{0} get-tuple-element(%arg1), index=0
  %tanh_fusion = f32[1024]{0} fusion(%gte1), kind=kLoop, calls=%fused_tanh
  ROOT %tuple.1 = (f32[1024]{0}) tuple(%tanh_fusion)
}

%fused_exp (param_0.2: f32[1024]) -> f32[1024] {
  %param_0.2 = f32[1024]{0} parameter(0)
  ROOT %exp.0 = f32[1024]{0} exponential(%param_0.2)
}

%fused_neg (param_0.3: f32[1024]) -> f32[1024] {
  %param_0.3 = f32[1024]{0} parameter(0)
  ROOT %neg.0 = f32[1024]{0} negate(%param_0.3)
}

ENTRY %main (i: INDEX[], x: f32[1024]) -> f32[1024] {
  %i = INDEX[] parameter(0)
  %x = f32[1024]{0} parameter(1)
  %exp_fusion = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_exp
  %neg_fusion = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_neg
  %tuple.2 = (f32[1024]{0}) tuple(%exp_fusion)
  %tuple.3 = (f32[1024]{0}) tuple(%neg_fusion)
  %cond = (f32[1024]{0}) conditional(%i, %tuple.2, %tuple.3), BRANCHES
  ROOT %gte2 = f32[1024]{0} get-tuple-element(%cond), index=0
}
"""

FORMS = {
    "branch_computations": ("s32", "branch_computations={%branch_0, %branch_1}"),
    "true_false": ("pred", "true_computation=%branch_0, false_computation=%branch_1"),
}


def _text(form: str) -> str:
  index, branches = FORMS[form]
  return MODULE.replace("INDEX", index).replace("BRANCHES", branches)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_branch_parameter_aliases_its_own_operand(form):
  m = hlo_audit.parse_hlo(_text(form))
  d = analyze_dataflow(m, flatten_schedule(m))
  exp, neg = d.buffer_of[("exp_fusion", ())], d.buffer_of[("neg_fusion", ())]
  assert d.buffer_of[("arg0", (0,))] == exp
  assert d.buffer_of[("arg1", (0,))] == neg
  # The branch index shares nothing with the branches' data.
  assert d.buffers[d.buffer_of[("i", ())]] == (("i", ()),)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_buffer_read_inside_a_branch_is_read_by_that_branchs_kernel(form):
  r = hlo_audit.audit_hlo(_text(form))
  bufs = {b.name: b for b in r.buffers}
  assert bufs["exp_fusion"].consumers == ("sqrt_fusion",)
  assert bufs["exp_fusion"].aliases == ("arg0{0}",)
  assert bufs["neg_fusion"].consumers == ("tanh_fusion",)
  assert bufs["neg_fusion"].aliases == ("arg1{0}",)
  # Both operands stay live until the conditional that passes them runs
  # (after its branches, in the flattened schedule).
  cond = r.program.schedule.time["cond"]
  assert cond > r.program.schedule.time["tanh_fusion"]
  assert bufs["exp_fusion"].live_range[1] == bufs["neg_fusion"].live_range[1] == cond

"""An optimizer's update read as what it is: the weight gradient a gemm
writes, read once by the kernel updating the parameter and Adam's two
moments (XLA:GPU's compiles for an H200 of optax and keras train steps,
committed HLO)."""

from __future__ import annotations

import functools

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support

E = FindingKind.UNFUSED_EPILOGUE


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name))


def _updates(name: str):
  return [f for f in _report(name).findings_of(E) if "adam" in f.ops]


def test_optax_adam_reading_a_weight_gradient_is_named():
  # flax's MLP with optax.adam: each kernel's dW (a Triton gemm) read by
  # the fusion writing the parameter, mu and nu.
  found = _updates("linen_mlp")
  assert found, [f.ops for f in _report("linen_mlp").findings_of(E)]
  for f in found:
    assert f.ops[0] == "outputs:3" and f.need.outputs == 3
    assert f.need.anchor == "dot" and "adam" in f.need.ops


def test_a_bf16_gradient_widened_for_the_update_keeps_its_cast():
  # The cross-entropy head's bf16 dW widened to f32 by the update.
  (f,) = [f for f in _updates("ce_head") if f.boundary_shape.startswith("bf16")][:1]
  assert f.ops == ("outputs:3", "adam", "cast:f32"), f.ops


def test_keras_adam_on_a_convolutions_gradient():
  # keras' Adam (its own formula: m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2))
  # after a convolution's filter gradient: the anchor stays the convolution,
  # whose filter-gradient kernel takes the update as its epilogue.
  found = _updates("keras_mobilenet")
  assert found
  assert {f.need.anchor for f in found} == {"convolution"}
  assert {f.kernel for f in found} == {"pallas_kernels.conv2d_weight_grad"}


def test_other_multi_output_readers_are_no_update():
  # An LSTM cell's gates (sigmoid, tanh) read from one gemm and written as
  # five arrays: no square, no square root. (Its head's dW, read by
  # optax's adam, is one.)
  gates = [f for f in _report("lstm").findings_of(E)
           if any(o in ("outputs:5", "outputs:2") for o in f.ops)]
  assert gates
  assert not [f for f in gates if "adam" in f.ops]
  assert [f.boundary_shape for f in _updates("lstm")] == ["f32[128,4]"]


_UPDATE = """
HloModule step, is_scheduled=true

%update (g: f32[32,16], p: f32[32,16], m: f32[32,16], v: f32[32,16]) -> (f32[32,16], f32[32,16], f32[32,16]) {
  %g = f32[32,16]{1,0} parameter(0)
  %p = f32[32,16]{1,0} parameter(1)
  %m = f32[32,16]{1,0} parameter(2)
  %v = f32[32,16]{1,0} parameter(3)
  %c = f32[32,16]{1,0} constant({...})
  %m1 = f32[32,16]{1,0} add(%m, %g)
  %g2 = f32[32,16]{1,0} multiply(%g, %g)
  %v1 = f32[32,16]{1,0} add(%v, %g2)
  %d = f32[32,16]{1,0} ROOT_OP(%v1)
  %s = f32[32,16]{1,0} divide(%m1, %d)
  %p1 = f32[32,16]{1,0} subtract(%p, %s)
  ROOT %t = (f32[32,16]{1,0}, f32[32,16]{1,0}, f32[32,16]{1,0}) tuple(%p1, %m1, %v1)
}

ENTRY %main (x: f32[64,32], dy: f32[64,16], p: f32[32,16], m: f32[32,16], v: f32[32,16]) -> (f32[32,16], f32[32,16], f32[32,16]) {
  %x = f32[64,32]{1,0} parameter(0)
  %dy = f32[64,16]{1,0} parameter(1)
  %p = f32[32,16]{1,0} parameter(2)
  %m = f32[32,16]{1,0} parameter(3)
  %v = f32[32,16]{1,0} parameter(4)
  %dw = f32[32,16]{1,0} dot(%x, %dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT %u = (f32[32,16]{1,0}, f32[32,16]{1,0}, f32[32,16]{1,0}) fusion(%dw, %p, %m, %v), kind=kLoop, calls=%update
}
"""


def _update_ops(root_op: str):
  text = _UPDATE.replace("ROOT_OP", root_op).replace("  %c = f32[32,16]{1,0} constant({...})\n", "")
  (f,) = hlo_audit.audit_hlo(text).findings_of(E)
  return f.ops


def test_adam_needs_the_square_root_of_the_second_moment():
  # m / sqrt(v + g^2): Adam's (RMSProp's) step.
  assert _update_ops("sqrt") == ("outputs:3", "adam")
  # m / exp(v + g^2): squares the gradient, but no step Adam takes.
  assert "adam" not in _update_ops("exponential")

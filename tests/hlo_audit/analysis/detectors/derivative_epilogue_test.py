"""An activation's derivative applied to a gemm's result (dz = dh * act'(z),
the backward of a dense layer's activation, reading the saved
pre-activation z): cuBLASLt's DGELU epilogue, which the audit names
"activation_grad:<act>". Hand-written HLO for each activation's form, and
XLA:GPU's own backward passes (committed H200 compiles)."""

from __future__ import annotations

import functools

import pytest

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support

W = "f32[128,512]{1,0}"

# The gemm's result g reaches the reader as p0; the pre-activation z (full
# size, written by the forward pass) as p1; a vector v as p2.
MODULE = f"""
HloModule dact, is_scheduled=true

%fused_reader (p0: f32[128,512], p1: f32[128,512], p2: f32[512]) -> f32[128,512] {{
  %p0 = {W} parameter(0)
  %p1 = {W} parameter(1)
  %p2 = f32[512]{{0}} parameter(2)
  %one = f32[] constant(1)
  %oneb = {W} broadcast(%one), dimensions={{}}
  %half = f32[] constant(0.5)
  %halfb = {W} broadcast(%half), dimensions={{}}
  BODY
}}

ENTRY %main (x: f32[128,256], w: f32[256,512], z: f32[128,512], v: f32[512]) -> f32[128,512] {{
  %x = f32[128,256]{{1,0}} parameter(0)
  %w = f32[256,512]{{1,0}} parameter(1)
  %z = {W} parameter(2)
  %v = f32[512]{{0}} parameter(3)
  %d = {W} dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %f = {W} fusion(%d, %z, %v), kind=kLoop, calls=%fused_reader
}}
"""


def _ops(body: str) -> tuple[str, ...]:
  (epi,) = hlo_audit.audit_hlo(MODULE.replace("BODY", body)).findings_of(
      FindingKind.UNFUSED_EPILOGUE)
  assert (epi.producer, epi.consumers) == ("d", ("f",))
  return epi.ops


# Each activation's derivative at z, ending in %dz (a value of z alone).
SIGMOID_PRIME = (f"%s = {W} logistic(%p1)\n  %c = {W} subtract(%oneb, %s)\n"
                 f"  %dz = {W} multiply(%s, %c)")
TANH_PRIME = (f"%t = {W} tanh(%p1)\n  %t2 = {W} multiply(%t, %t)\n"
              f"  %dz = {W} subtract(%oneb, %t2)")
# Phi(z) + z * phi(z), phi(z) = exp(-z^2 / 2) / sqrt(2 pi).
GELU_PRIME = (
    f"%r2 = f32[] constant(0.707106769)\n  %r2b = {W} broadcast(%r2), dimensions={{}}\n"
    f"  %zs = {W} multiply(%p1, %r2b)\n  %e = {W} erf(%zs)\n  %e1 = {W} add(%e, %oneb)\n"
    f"  %cdf = {W} multiply(%e1, %halfb)\n  %z2 = {W} multiply(%p1, %p1)\n"
    f"  %nz = {W} multiply(%z2, %halfb)\n  %ng = {W} negate(%nz)\n  %ex = {W} exponential(%ng)\n"
    f"  %k = f32[] constant(0.398942292)\n  %kb = {W} broadcast(%k), dimensions={{}}\n"
    f"  %pdf = {W} multiply(%ex, %kb)\n  %zp = {W} multiply(%p1, %pdf)\n"
    f"  %dz = {W} add(%cdf, %zp)")


@pytest.mark.parametrize("prime, act", [
    (SIGMOID_PRIME, "sigmoid"), (TANH_PRIME, "tanh"), (GELU_PRIME, "gelu")])
def test_the_gradient_times_a_derivative_of_the_pre_activation_names_it(prime, act):
  assert _ops(f"{prime}\n  ROOT %r = {W} multiply(%p0, %dz)") == (f"activation_grad:{act}",)
  # The factor on the left, and the product negated twice: still linear in g.
  assert _ops(f"{prime}\n  %m = {W} multiply(%dz, %p0)\n  %n = {W} negate(%m)\n"
              f"  ROOT %r = {W} negate(%n)") == (f"activation_grad:{act}",)


def test_silu_multiplies_the_pre_activation_itself_a_sigmoid_does_not():
  # JAX's silu backward: g * s + (g * z) * s * (1 - s), z read by the
  # gradient's own product.
  silu = _ops(f"{SIGMOID_PRIME}\n  %gs = {W} multiply(%p0, %s)\n"
              f"  %gz = {W} multiply(%p0, %p1)\n  %t = {W} multiply(%gz, %dz)\n"
              f"  ROOT %r = {W} add(%gs, %t)")
  assert silu == ("activation_grad:silu",)
  # s * (1 + z * (1 - s)): z multiplied inside the factor.
  factored = _ops(f"{SIGMOID_PRIME}\n  %zc = {W} multiply(%p1, %c)\n"
                  f"  %u = {W} add(%zc, %oneb)\n  %q = {W} multiply(%s, %u)\n"
                  f"  ROOT %r = {W} multiply(%p0, %q)")
  assert factored == ("activation_grad:silu",)


def test_work_that_is_not_linear_in_the_gradient_is_no_derivative():
  # A vector added after the product is a bias; the chain is no longer g
  # times a factor.
  biased = _ops(f"{TANH_PRIME}\n  %m = {W} multiply(%p0, %dz)\n"
                f"  %vb = {W} broadcast(%p2), dimensions={{1}}\n  ROOT %r = {W} add(%m, %vb)")
  assert not any(w.startswith("activation_grad") for w in biased), biased
  # The gradient squared, then times a derivative: not linear either.
  squared = _ops(f"{TANH_PRIME}\n  %gg = {W} multiply(%p0, %p0)\n"
                 f"  ROOT %r = {W} multiply(%gg, %dz)")
  assert not any(w.startswith("activation_grad") for w in squared), squared
  # The activation applied to the gradient itself is a forward epilogue.
  assert _ops(f"ROOT %r = {W} tanh(%p0)") == ("activation:tanh",)
  # A product with a saved array alone (a dropout mask, a derivative the
  # forward pass wrote) names no activation.
  assert _ops(f"ROOT %r = {W} multiply(%p0, %p1)") == ("product",)


def test_a_maximum_in_the_factor_is_a_recomputed_forward_value_not_a_relu():
  # softplus' derivative as JAX's logaddexp writes it, exp(z - softplus(z)),
  # with max(z, 0) recomputed and the rest saved: no relu (whose derivative
  # is a select), no derivative named.
  ops = _ops(f"%zero = f32[] constant(0)\n  %zb = {W} broadcast(%zero), dimensions={{}}\n"
             f"  %m = {W} maximum(%p1, %zb)\n  %sp = {W} add(%m, %p1)\n"
             f"  %df = {W} subtract(%p1, %sp)\n  %e = {W} exponential(%df)\n"
             f"  ROOT %r = {W} multiply(%p0, %e)")
  assert not any(w.startswith("activation_grad") for w in ops), ops


def test_a_derivative_of_a_vector_is_a_scale_not_the_pre_activation():
  # tanh' of a per-column vector broadcast: no full-size operand to read.
  ops = _ops(f"%vb = {W} broadcast(%p2), dimensions={{1}}\n  %t = {W} tanh(%vb)\n"
             f"  %t2 = {W} multiply(%t, %t)\n  %dz = {W} subtract(%oneb, %t2)\n"
             f"  ROOT %r = {W} multiply(%p0, %dz)")
  assert not any(w.startswith("activation_grad") for w in ops), ops


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name))


@pytest.mark.parametrize("model, producer, act", [
    # The built-in example's MLP: exact GELU, its derivative from erfc's
    # expansion and the forward's saved Phi(z).
    ("example", "gemm_fusion_dot.17", "gelu"),
    # A flax group-norm CNN's swish after a convolution's input gradient.
    ("groupnorm_cnn", "cudnn-conv-bw-input.1", "silu"),
    # A haiku LM's MLP: jax.nn.gelu's tanh form.
    ("haiku_lm", "gemm_fusion_dot.31", "gelu_tanh"),
])
def test_xla_gpus_backward_through_an_activation_names_its_derivative(model, producer, act):
  found = [f for f in _report(model).findings_of(FindingKind.UNFUSED_EPILOGUE)
           if f.producer == producer]
  assert [f.ops for f in found] == [(f"activation_grad:{act}",)]
  assert f"times {act}'s derivative at a pre-activation" in found[0].evidence

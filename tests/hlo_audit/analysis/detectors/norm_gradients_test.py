"""A norm's backward pass and its scale gradient name the norm's own kernel
(its backward runs as one pass over dy, gamma's and beta's gradients summed
beside dx), and which norm: a layer norm's statistic is a variance (a
subtraction of the mean leads to its rsqrt), an RMS norm's a mean of squares;
a batch norm's rsqrt is one per channel, no row norm at all."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit import FindingKind

#: The forward kernel computing x_hat over rows of f32[64,128].
LAYER = """
  %mean = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%add
  %mb = f32[64,128]{1,0} broadcast(%mean), dimensions={0}
  %d = f32[64,128]{1,0} subtract(%x, %mb)
  %sq = f32[64,128]{1,0} multiply(%d, %d)
  %var = f32[64]{0} reduce(%sq, %z), dimensions={1}, to_apply=%add
  %r = f32[64]{0} rsqrt(%var), metadata={op_name="jit(f)/jvp()/rsqrt"}
  %rb = f32[64,128]{1,0} broadcast(%r), dimensions={0}
  ROOT %xhat = f32[64,128]{1,0} multiply(%d, %rb)"""

RMS = """
  %sq = f32[64,128]{1,0} multiply(%x, %x)
  %ms = f32[64]{0} reduce(%sq, %z), dimensions={1}, to_apply=%add
  %r = f32[64]{0} rsqrt(%ms), metadata={op_name="jit(f)/jvp()/rsqrt"}
  %rb = f32[64,128]{1,0} broadcast(%r), dimensions={0}
  ROOT %xhat = f32[64,128]{1,0} multiply(%x, %rb)"""

#: A batch norm's: one statistic per channel (column) of f32[64,128].
BATCH = """
  %mean = f32[128]{0} reduce(%x, %z), dimensions={0}, to_apply=%add
  %mb = f32[64,128]{1,0} broadcast(%mean), dimensions={1}
  %d = f32[64,128]{1,0} subtract(%x, %mb)
  %sq = f32[64,128]{1,0} multiply(%d, %d)
  %var = f32[128]{0} reduce(%sq, %z), dimensions={0}, to_apply=%add
  %r = f32[128]{0} rsqrt(%var), metadata={op_name="jit(f)/jvp()/rsqrt"}
  %rb = f32[64,128]{1,0} broadcast(%r), dimensions={1}
  ROOT %xhat = f32[64,128]{1,0} multiply(%d, %rb)"""


def _module(forward: str) -> str:
  """x_hat written by a forward kernel; in the backward, dy * x_hat written
  by one kernel and summed over the rows by another (gamma's gradient)."""
  return f"""
HloModule norm, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%fused_norm (p0: f32[64,128]) -> f32[64,128] {{
  %x = f32[64,128]{{1,0}} parameter(0)
  %z = f32[] constant(0){forward}
}}

%fused_dy (p0: f32[64,128]) -> f32[64,128] {{
  %p0 = f32[64,128]{{1,0}} parameter(0)
  ROOT %t = f32[64,128]{{1,0}} tanh(%p0), metadata={{op_name="jit(f)/transpose(jvp())/tanh"}}
}}

%fused_dgamma_term (p0: f32[64,128], p1: f32[64,128]) -> f32[64,128] {{
  %p0 = f32[64,128]{{1,0}} parameter(0)
  %p1 = f32[64,128]{{1,0}} parameter(1)
  ROOT %m = f32[64,128]{{1,0}} multiply(%p0, %p1), metadata={{op_name="jit(f)/transpose(jvp())/mul"}}
}}

%fused_colsum (p0: f32[64,128]) -> f32[128] {{
  %p0 = f32[64,128]{{1,0}} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[128]{{0}} reduce(%p0, %z), dimensions={{0}}, to_apply=%add, metadata={{op_name="jit(f)/transpose(jvp())/reduce_sum"}}
}}

ENTRY %main (x: f32[64,128], g: f32[64,128]) -> (f32[64,128], f32[128]) {{
  %x = f32[64,128]{{1,0}} parameter(0)
  %g = f32[64,128]{{1,0}} parameter(1)
  %xhat = f32[64,128]{{1,0}} fusion(%x), kind=kInput, calls=%fused_norm, metadata={{op_name="jit(f)/jvp()/mul"}}
  %dy = f32[64,128]{{1,0}} fusion(%g), kind=kLoop, calls=%fused_dy, metadata={{op_name="jit(f)/transpose(jvp())/tanh"}}
  %term = f32[64,128]{{1,0}} fusion(%dy, %xhat), kind=kLoop, calls=%fused_dgamma_term, metadata={{op_name="jit(f)/transpose(jvp())/mul"}}
  %dgamma = f32[128]{{0}} fusion(%term), kind=kInput, calls=%fused_colsum, metadata={{op_name="jit(f)/transpose(jvp())/reduce_sum"}}
  ROOT %out = (f32[64,128]{{1,0}}, f32[128]{{0}}) tuple(%xhat, %dgamma)
}}
"""


def _gamma_term(forward: str):
  report = hlo_audit.audit_hlo(_module(forward))
  (f,) = [f for f in report.findings_of(FindingKind.SEPARATE_REDUCTION)
          if f.boundary == "term"]
  return f


@pytest.mark.parametrize("forward, norm", [(LAYER, "layer_norm"), (RMS, "rms_norm")])
def test_the_scale_gradients_column_sum_names_the_norm_it_belongs_to(forward, norm):
  f = _gamma_term(forward)
  assert f.ops == ("column_reduction",)
  assert f.need.anchor == f"{norm}_backward"
  assert f.kernel == f"pallas_kernels.{norm}"
  assert "scale (gamma) gradient" in f.evidence


def test_a_batch_norms_scale_gradient_is_no_row_norms():
  # The rsqrt is one per channel: no layer or RMS norm kernel computes it.
  f = _gamma_term(BATCH)
  assert f.need.anchor == "column_reduction"
  assert f.kernel is None


def test_a_forward_kernel_is_where_x_hat_comes_from():
  # The same product, but of a value the backward pass computed: no norm's.
  text = _module(LAYER).replace(
      'fusion(%x), kind=kInput, calls=%fused_norm, metadata={op_name="jit(f)/jvp()/mul"}',
      'fusion(%x), kind=kInput, calls=%fused_norm, metadata={op_name="jit(f)/transpose(jvp())/mul"}')
  (f,) = [f for f in hlo_audit.audit_hlo(text).findings_of(FindingKind.SEPARATE_REDUCTION)
          if f.boundary == "term"]
  assert f.need.anchor == "column_reduction"


# ------------------------------------------------ XLA:GPU's own programs --

def _h200(name: str):
  from tests.hlo_audit.real_models import h200_support
  return hlo_audit.audit_hlo(h200_support.fixture(name))


def test_the_examples_layer_norm_backward_on_an_h200_names_layer_norm():
  # XLA:GPU (jax 0.12): ln1's dy re-read by the row sums and beta's column
  # sum (transformer.py:80), and both norms' dy * x_hat and ln2's dy summed
  # over the tokens (gamma's and beta's gradients).
  r = _h200("example")
  named = [f for f in r.findings_of(FindingKind.SEPARATE_REDUCTION)
           if f.need is not None and f.need.anchor == "layer_norm_backward"]
  assert sorted((f.ops[0], f.boundary_shape) for f in named) == [
      ("column_reduction", "f32[4,128,256]"), ("column_reduction", "f32[4,128,256]"),
      ("column_reduction", "f32[512,256]"), ("norm_backward", "f32[512,256]")]
  assert all(f.kernel == "pallas_kernels.layer_norm" for f in named)
  # dy * x_hat summed is gamma's gradient; ln2's dy summed beside the kernel
  # forming dy * x_hat, beta's.
  said = {f.boundary_shape: [] for f in named}
  for f in named:
    if f.ops[0] == "column_reduction":
      said[f.boundary_shape].append("scale (gamma)" in f.evidence)
  assert said == {"f32[4,128,256]": [True, True], "f32[512,256]": [False]}
  assert not [f for f in r.findings if f.need and f.need.anchor == "rms_norm_backward"]


def test_penzais_rms_norm_gradients_on_an_h200_name_rms_norm():
  # penzai's llama normalizes by the root mean square: no mean subtracted.
  # Three of its norms' dy are a split-K gemm's partial sums, f32[k,128,64],
  # whose rows are read as [4,32,64]: the rstd is one per such row.
  r = _h200("penzai_llama")
  named = [f for f in r.findings if f.need is not None and f.need.anchor.endswith("_backward")]
  assert {f.need.anchor for f in named} == {"rms_norm_backward"}
  assert sum(f.ops == ("norm_backward",) for f in named) == 3

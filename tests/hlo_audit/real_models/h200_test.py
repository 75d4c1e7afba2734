"""XLA:GPU's structure read right: the suite's models compiled for an H200
(committed HLO, `h200_support.py`), judged against each model's hand-read
`TRUTH_H200` as the CPU suite is against `TRUTH` (every finding judged), and
the GPU rules held on them: split-K sums belong to their gemm, XLA's Triton
softmax is one kernel, a gemm -> softmax -> gemm chain needs a fused
attention kernel, cuDNN's fused convolution is already fused."""

from __future__ import annotations

import functools
import pathlib

import pytest

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support, truth

R = FindingKind.SEPARATE_REDUCTION

#: The models the H200 suite judges (a model whose library is missing still
#: has its compile committed, but its truth names lines of its module).
MODELS = truth.MODELS


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name))


def _truth(name: str) -> truth.ModelTruth:
  pytest.importorskip("flax")
  pytest.importorskip("equinox")
  pytest.importorskip("optax")
  missing = truth.missing_library(name)
  if missing:
    pytest.skip(f"not installed: pip install '{missing}'")
  judged = truth.truth_of(name, "h200")
  assert judged is not None, f"model_{name}.py has no TRUTH_H200: its H200 findings are unjudged"
  return judged


@pytest.mark.parametrize("name", MODELS)
def test_h200_markers_name_lines_of_the_model(name):
  t = _truth(name)
  used = {e.marker for e in t.expect if e.marker} | {n.marker for n in t.not_flagged if n.marker}
  assert used <= truth.markers(name).keys(), used - truth.markers(name).keys()


@pytest.mark.parametrize("name", MODELS)
def test_h200_named_non_findings_name_buffers_of_the_audit(name):
  t = _truth(name)
  names = {b.name for b in _report(name).buffers}
  missing = {n.boundary for n in t.not_flagged if n.boundary} - names
  assert not missing, missing


@pytest.mark.parametrize("name", MODELS)
def test_h200_expected_findings_are_reported(name):
  t = _truth(name)
  r = _report(name)
  out = truth.compare(name, r.findings, t)
  missing = [f"{e.label} {e.shape} at " +
             (f"<{e.marker}> (line {truth.markers(name)[e.marker]})" if e.marker else "any line") +
             f": {n} of {e.count} missing; {e.why}" for e, n in out.missed]
  assert not missing, "\n".join(missing) + "\n\nreported:\n" + "\n".join(
      truth.describe(name, f) for f in r.findings if f.kind not in truth.UNSCORED)


@pytest.mark.parametrize("name", MODELS)
def test_h200_no_finding_contradicts_the_hlo(name):
  t = _truth(name)
  out = truth.compare(name, _report(name).findings, t)
  assert not out.false_positives, "\n".join(
      f"{truth.describe(name, f)}\n    -> {why}" for f, why in out.false_positives)


@pytest.mark.parametrize("name", MODELS)
def test_h200_every_finding_is_judged(name):
  t = _truth(name)
  out = truth.compare(name, _report(name).findings, t)
  assert not out.unjudged, "findings the H200 truth neither expects nor rules out:\n" + \
      "\n".join(f"{truth.describe(name, f)}\n    {f.evidence[:300]}" for f in out.unjudged)


@pytest.mark.parametrize("name", MODELS)
def test_h200_findings_cite_the_models_file_when_the_stack_holds_it(name):
  _truth(name)
  here = truth.model_file(name).name
  for f in _report(name).findings:
    if any(pathlib.Path(loc.file).name == here for loc in f.source_stack):
      assert f.source is not None and pathlib.Path(f.source.file).name == here, \
          truth.describe(name, f)


def test_split_k_partial_sums_belong_to_their_gemm():
  # linen_mlp: gemm_fusion_dot.3 writes f32[4,128,512] partial sums that
  # loop_reduce_fusion sums over dimension 0 (to_apply
  # dot.3.reduce_sub_computation): no reduction of the program's.
  r = _report("linen_mlp")
  for f in r.findings:
    assert not (f.kind is R and f.boundary_shape.startswith(("f32[4,", "f32[8,", "f32[16,128"))), f
  split = [f for f in r.findings_of(FindingKind.ALREADY_FUSED)
           if "split-K" in f.evidence]
  assert split, [f.evidence for f in r.findings_of(FindingKind.ALREADY_FUSED)]


def test_xla_triton_softmax_is_one_kernel_and_attention_is_the_fix():
  r = _report("nnx_vit")
  assert not [f for f in r.findings if f.kernel == "pallas_kernels.softmax"]
  attention = [f for f in r.findings_of(R) if f.ops == ("attention",)]
  # Forward scores -> softmax -> PV, and the softmax backward between dP and
  # the dS dots: the gemm-side boundaries of both.
  assert len(attention) == 2, [(f.ops, f.boundary) for f in r.findings_of(R)]
  for f in attention:
    assert f.kernel is None and f.boundary_shape == "f32[32,16,16]"
    assert 'jax.nn.dot_product_attention(q, k, v, implementation="cudnn")' in f.evidence


def test_cudnn_fused_convolution_is_already_fused():
  r = _report("bn_cnn")
  fused = [f for f in r.findings_of(FindingKind.ALREADY_FUSED)
           if "__cudnn$convBiasActivationForward" in f.evidence]
  assert len(fused) == 2 and all(f.ops == ("bias",) for f in fused)
  # Its result is no unfused bias epilogue.
  assert not [f for f in r.findings_of(FindingKind.UNFUSED_EPILOGUE) if "bias" in f.ops
              and f.producer.startswith("cudnn-conv-bias-activation")]


def test_the_fixture_is_what_xla_gpu_compiles_today():
  reason = h200_support.unavailable()
  if reason:
    pytest.skip(reason)
  import jax
  from tests.hlo_audit.real_models import truth
  if truth.jax_version()[:2] != (0, 12):
    pytest.skip(f"fixtures were compiled by jax 0.12; this is jax {jax.__version__}")
  fn, args = truth.model("linen_mlp").build()
  live = hlo_audit.parse_hlo(h200_support.compile_text(fn, args))
  kept = hlo_audit.parse_hlo(h200_support.fixture("linen_mlp"))
  assert sorted(i.name for i in live.entry.instructions) == \
      sorted(i.name for i in kept.entry.instructions)

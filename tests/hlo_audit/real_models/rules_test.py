"""Rules read off whole third-party models (`truth.py`'s suite): each test
holds one rule on the model where the HLO shows it, and fails when the
rule is broken."""

from __future__ import annotations

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

from hlo_audit import FindingKind, NumericalClass, Verdict  # noqa: E402
from tests.hlo_audit.real_models import truth  # noqa: E402

pytestmark = pytest.mark.slow
R = FindingKind.SEPARATE_REDUCTION


def _reductions(name: str):
  return truth.report(name).findings_of(R)


def test_a_norm_over_two_axes_gets_no_last_axis_norm_kernel():
  # equinox's LayerNorm((64, 128)): statistics over dims {1,2}, gamma [64,128].
  norms = [f for f in _reductions("eqx_layernorm2d") if f.ops == ("layer_norm",)]
  assert norms, [(f.ops, f.boundary) for f in _reductions("eqx_layernorm2d")]
  for f in norms:
    assert f.kernel is None and not f.suggestion, f
    assert "no kernel yet" in f.evidence
    assert "dims {1,2} of [16,64,128] (8192 elements per statistic" in f.evidence
    assert "affine [64,128]" in f.evidence


def test_reductions_are_named_by_the_axes_they_reduce():
  # GroupNorm keeps the batch axis: per-sample statistics over groups.
  groups = [f for f in _reductions("groupnorm_cnn") if f.ops == ("group_norm_stats",)]
  assert len(groups) == 2, [(f.ops, f.boundary_shape) for f in _reductions("groupnorm_cnn")]
  for f in groups:
    assert "dims {1,2,4} of [8,32,32,8,4]" in f.evidence
    assert "batch axis 0 kept" in f.evidence
  for name in ("groupnorm_cnn", "eqx_layernorm2d", "moe"):
    for f in truth.report(name).findings:
      assert "batch_norm_stats" not in f.ops and "batch-norm" not in f.evidence, (name, f)
  # The router's one-hot dispatch summed over tokens and top-k is forward
  # work, not a bias or gamma gradient.
  (onehot,) = [f for f in _reductions("moe") if f.boundary_shape == "f32[256,2,8]"]
  assert "gradient" not in onehot.evidence and "forward pass" in onehot.evidence


@pytest.mark.parametrize("name, count", [("groupnorm_cnn", 2), ("bn_cnn", 2),
                                         ("equinox_mlp", 1)])
def test_x_hat_saved_for_one_backward_reduction_is_a_finding(name, count):
  saved = [f for f in _reductions(name) if "recompute x_hat" in f.ops]
  assert len(saved) == count, [(f.ops, f.boundary) for f in _reductions(name)]
  for f in saved:
    assert f.verdict is Verdict.SAFE and len(f.consumers) == 1
    assert "backward pass" in f.evidence
    # What the reduction holds to recompute it on load.
    assert f.extra_resources == "the per-row statistics tile"


def test_dropping_a_narrowing_round_trip_is_never_exact_or_safe():
  # Where the HLO holds f32 -> bf16 -> f32 kernels: transformers' bf16 BERT
  # (attention probabilities), and flax's bf16 MLP on jax 0.10 (the weight
  # gradients' bf16 casts read back in f32 by adamw).
  names = [n for n, has in (("bert_mlm", not truth.missing_library("bert_mlm")),
                            ("bf16_mlp", not truth.NATIVE_BF16_DOT)) if has]
  if not names:
    pytest.skip("no model here holds a narrowing round trip: pip install "
                f"'{truth.missing_library('bert_mlm')}'")
  for name in names:
    trips = [f for f in truth.report(name).findings if "narrowing round trip" in f.evidence]
    assert trips, f"{name}: the f32 -> bf16 -> f32 kernels were not seen"
    for f in trips:
      assert f.numerical_class is NumericalClass.PRECISION_CHANGE, truth.describe(name, f)
      assert f.verdict is not Verdict.SAFE, truth.describe(name, f)

"""Gaps that one fused kernel closes whole, read from XLA's real H200
compiles (committed, `h200_support.py`): a cross-entropy head's logits and
their gradient (a fused linear cross-entropy), a GLU's gate and up
projections (a GLU kernel); and what is neither (an LSTM's four gates, an
MLP as wide as the vocabulary)."""

from __future__ import annotations

import functools

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.analysis.detectors import cross_entropy
from tests.hlo_audit.real_models import h200_support

H200 = hlo_audit.AuditOptions(device="h200")


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name), options=H200)


def _anchored(r, anchor: str):
  return [f for f in r.findings if f.need is not None and f.need.anchor == anchor]


def test_the_32k_head_is_one_cross_entropy_whose_logits_and_gradient_it_closes():
  r = _report("ce_head")
  (head,) = cross_entropy.heads(r.program)
  # x @ W: 256 tokens of 64 against a 32768-entry vocabulary.
  assert (head.kernel, head.tokens, head.dim, head.vocab) == (
      "gemm_fusion_dot.1", 256, 64, 32768)
  found = _anchored(r, "linear_cross_entropy")
  # The f32 gradient the bias's column sum re-reads (64 MiB) and the bf16
  # logits the row max and sum re-read (16 MiB): 80 of the step's 92 MiB.
  assert sorted((f.boundary_shape, f.bytes_saved >> 20) for f in found) == [
      ("bf16[256,32768]", 16), ("f32[4,64,32768]", 64)]
  for f in found:
    assert f.need.anchor_kernel == head.kernel
    assert f.kernel == "pallas_kernels.linear_cross_entropy"
    assert f.suggestion.startswith(
        "pallas_kernels.linear_cross_entropy(x, w, labels)  # x: bf16[256,64], "
        "w: bf16[64,32768], labels: s32[256]")
    assert "cross-entropy over 32768 classes" in f.evidence
  # The weight gradient's Adam epilogue ([dim, vocab]) is no logits buffer.
  assert not [f for f in found if f.boundary_shape == "bf16[64,32768]"]


def test_an_mlp_as_wide_as_the_vocabulary_is_not_the_heads():
  # haiku's LM: vocabulary 256, d_ff 256, 128 tokens: the MLP's [128, 256]
  # activations have the logits' shape but are not computed from them.
  r = _report("haiku_lm")
  (head,) = cross_entropy.heads(r.program)
  found = _anchored(r, "linear_cross_entropy")
  assert found and all(f.boundary in head.region for f in found)
  mlp = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE
         and f.boundary_shape == "f32[128,256]"]
  assert mlp and not [f for f in mlp if f.need is not None
                      and f.need.anchor == "linear_cross_entropy"]


def test_a_swiglu_gemm_as_wide_as_the_vocabulary_is_no_head():
  # penzai's llama: [w_gate | w_up] is [64, 256], as wide as the vocabulary
  # and read through silu's exp; only its tokens are ever reduced over.
  r = _report("penzai_llama")
  assert all(h.kernel not in ("gemm_fusion_dot.78", "gemm_fusion_dot.80")
             for h in cross_entropy.heads(r.program))


def test_a_glu_gemm_read_by_the_swiglu_kernel_needs_a_glu_kernel():
  r = _report("kv_decode")
  found = _anchored(r, "glu")
  assert len(found) == 2  # one per layer
  for f in found:
    assert f.boundary_shape == "bf16[4,1024]"
    # silu computed in f32 and rounded back: no cast, the activation found.
    assert f.ops == ("glu", "multiply:halves", "activation:silu")
    assert f.kernel == "pallas_kernels.glu_matmul"
    # XLA computes [w_gate | w_up]^T x^T: the call still names x first.
    assert f.suggestion.startswith(
        "pallas_kernels.glu_matmul(x, w_gate, w_up, activation='silu')  # x: bf16[4,256], "
        "w_gate: bf16[256,512], w_up: bf16[256,512] -> bf16[4,512]")
    assert f.guard_verdict == "kernel runs (guard passes on gpu: triton)"


def test_an_lstms_gates_multiplied_slice_by_slice_are_no_glu():
  r = _report("lstm")
  assert not _anchored(r, "glu")
  gates = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE
           and "activation:sigmoid+tanh" in f.ops]
  assert gates and not [f for f in gates if "glu" in f.ops]


def test_an_activation_computed_wider_and_rounded_back_is_no_cast():
  # bert's bf16 MLP: gelu computed in f32 on the gemm's bf16 result, the
  # result written in bf16: the epilogue casts nothing.
  r = _report("bert_mlm")
  gelu = [f for f in r.findings if "activation:gelu" in f.ops]
  assert gelu and all(f.boundary_shape == "bf16[256,256]" for f in gelu)
  assert not [f for f in gelu if any(op.startswith("cast") for op in f.ops)]


def test_the_audited_device_decides_the_pallas_kernels_verdict():
  # Priced on an H200, the guard is asked for the H200 (not this CPU).
  on_h200 = [f.guard_verdict for f in _report("bf16_mlp").findings if f.guard_verdict]
  assert on_h200 and all("on gpu" in v for v in on_h200)
  plain = hlo_audit.audit_hlo(h200_support.fixture("bf16_mlp"))
  assert all("on gpu" not in f.guard_verdict for f in plain.findings)

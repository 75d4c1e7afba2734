"""JAX's own fused calls through the kernel-library seam: which call an
attention chain gets on which device, read from XLA's real H200 compiles."""

from __future__ import annotations

import functools

import pytest

import hlo_audit
from hlo_audit import plugins
from pallas_kernels._src.audit import jax_calls
from pallas_kernels._src.audit.jax_calls import AttentionShape, LIBRARY
from tests.hlo_audit.real_models import h200_support


def _shape(dtype="bf16", head_dim=64, queries=128, keys=128):
  return AttentionShape(dtype=dtype, batch=(4, 8), queries=queries, keys=keys,
                        head_dim=head_dim)


def _gpu(cc):
  return hlo_audit.DeviceFacts(name="gpu", description="", platform="gpu",
                               memory_bandwidth=1e12, compute_capability=cc)


H200 = hlo_audit.device_facts("h200")


def test_the_entry_point_offers_jax_beside_pallas_kernels_and_only_ours_swap():
  found = plugins.installed_libraries(refresh=True)
  assert [lib.name for lib in found.libraries] == ["jax", "pallas_kernels"]
  assert isinstance(LIBRARY, plugins.KernelLibrary)
  # JAX's calls are swapped in by pallas_kernels: the CLI's swap and its
  # hints name the library that swaps.
  assert [lib.name for lib in found.swapping] == ["pallas_kernels"]


def test_a_report_with_jaxs_fixes_hints_the_swap_of_the_library_that_swaps():
  r = hlo_audit.audit_hlo(h200_support.fixture("bert_mlm"),
                          options=hlo_audit.AuditOptions(device="h200"))
  assert any(f.kernel == jax_calls.ATTENTION for f in r.findings)
  assert r.kernel_libraries == ("pallas_kernels",)
  text = r.to_text()
  assert "pallas_kernels.swap(fn)" in text and "jax.swap(fn)" not in text


def test_the_h200_facts_carry_the_compute_capability_from_xlas_spec():
  assert H200.compute_capability == "9.0"
  assert hlo_audit.DeviceFacts.from_dict(H200.to_dict()).compute_capability == "9.0"


@pytest.mark.parametrize("shape, cc, why", [
    (_shape(), "9.0", ""),
    (_shape(head_dim=256), "9.0", ""),              # Hopper takes 256
    (_shape(head_dim=256), "8.0", "<= 128"),        # Ampere stops at 128
    (_shape(head_dim=264), "9.0", "<= 256"),
    (_shape(head_dim=60), "9.0", "multiple of 8"),
    (_shape(dtype="f16"), "8.0", ""),
    (_shape(dtype="f32"), "9.0", "bf16 or f16 only (q is f32)"),
    (_shape(), "7.5", "8.0 or later (sm_75)"),
])
def test_cudnn_takes_what_jaxs_flash_attention_check_takes(shape, cc, why):
  reason = jax_calls.cudnn_reason(shape, _gpu(cc))
  assert (why in reason) if why else reason == ""


def test_cudnn_needs_a_gpu_and_says_which_device_it_was_offered():
  assert "the device is cpu" in jax_calls.cudnn_reason(
      _shape(), hlo_audit.DeviceFacts(name="cpu", description="", platform="cpu",
                                      memory_bandwidth=1e10))
  assert "unknown" in jax_calls.cudnn_reason(_shape(), None)


@pytest.mark.parametrize("shape, why", [
    (_shape(dtype="f32"), ""),
    (_shape(queries=32, keys=32), ""),          # one block of the whole sequence
    (_shape(queries=384), ""),                  # three blocks
    (_shape(queries=200), "queries (200) to be a multiple of 128"),
    (_shape(queries=24), "a power of two below it"),
    (_shape(keys=130), "keys (130)"),
    (_shape(dtype="f8e4m3fn"), "takes f32, bf16 or f16"),
])
def test_jaxs_pallas_attention_takes_whole_blocks_of_both_sequences(shape, why):
  reason = jax_calls.pallas_reason(shape, H200)
  assert (why in reason) if why else reason == ""


@functools.cache
def _attention(name: str, device: str | None):
  options = hlo_audit.AuditOptions(device=device) if device else None
  r = hlo_audit.audit_hlo(h200_support.fixture(name), options=options)
  return [f for f in r.findings if "attention" in f.ops]


def test_a_bf16_bert_on_an_h200_gets_cudnn_flash_attention():
  found = _attention("bert_mlm", "h200")
  assert found and all(f.kernel == jax_calls.ATTENTION for f in found)
  for f in found:
    assert f.suggestion.startswith('jax.nn.dot_product_attention(q, k, v, implementation="cudnn")')
    # bf16[32,32,32] scores: 32 queries, 32 keys, heads of 16 (the HLO's dot).
    assert "q: bf16[B,32,N,16]" in f.suggestion and "B*N = 32" in f.suggestion
    assert f.guard_verdict.startswith("kernel runs (cuDNN flash attention on sm_90")


def test_an_f32_chain_gets_jaxs_pallas_kernel_and_says_why_not_cudnn():
  found = _attention("example", "h200")
  assert len(found) == 2
  for f in found:
    assert f.suggestion.startswith(jax_calls.PALLAS_ATTENTION + "(q, k, v, None")
    assert "q: f32[B,128,N,64]" in f.suggestion
    assert "bf16 or f16 only (q is f32)" in f.guard_verdict
    assert f.guard_verdict.startswith("kernel runs")


def test_a_decode_step_computing_k_times_q_keeps_queries_and_keys_apart():
  # XLA computes the decode step's scores as cache @ q^T: the dot's left
  # operand holds the 256 keys; the softmax's axis says which is which.
  found = _attention("kv_decode", "h200")
  assert found
  for f in found:
    assert "q: bf16[B,4,N,32], k: bf16[B,256,N,32]" in f.suggestion


def test_without_a_device_the_call_is_named_and_the_verdict_says_xla_keeps_it():
  found = _attention("bert_mlm", None)
  assert found and all(f.kernel == jax_calls.ATTENTION for f in found)
  assert all(f.guard_verdict.startswith("falls back to XLA: cuDNN's fused attention "
                                        "needs an NVIDIA GPU") for f in found)


def test_other_needs_are_not_jaxs():
  class F:
    need = plugins.KernelNeed(hlo_audit.FindingKind.SEPARATE_REDUCTION, "softmax")
  assert LIBRARY.kernel_for(F()).op is None


V5E = hlo_audit.device_facts("v5e")


@pytest.mark.parametrize("shape, why", [
    (_shape(), ""),
    (_shape(dtype="f32", queries=256, keys=512), ""),
    (_shape(dtype="f16"), "takes f32 or bf16"),
    (_shape(queries=64), "at least 128 queries"),
    (_shape(keys=192), "keys (192) to be a multiple of 128"),
    (_shape(keys=64), "keys (64) to be a multiple of 128"),
])
def test_jaxs_tpu_flash_attention_takes_its_default_blocks(shape, why):
  reason = jax_calls.tpu_flash_reason(shape, V5E)
  assert (why in reason) if why else reason == ""
  assert "needs a TPU" in jax_calls.tpu_flash_reason(_shape(), H200)


def test_on_a_tpu_an_attention_chain_gets_jaxs_tpu_flash_attention():
  found = _attention("example", "v5e")  # 128 queries and keys, f32
  assert len(found) == 2
  for f in found:
    assert f.suggestion.startswith(jax_calls.TPU_FLASH_ATTENTION + "(q, k, v, causal=causal")
    assert f.guard_verdict.startswith("kernel runs (JAX's Pallas flash attention for TPUs")
  short = _attention("bert_mlm", "v5e")  # 32 queries: below its block
  assert short and all(f.guard_verdict.startswith("falls back to XLA: JAX's TPU flash "
                                                   "attention needs at least 128 queries")
                       for f in short)


def test_pallas_kernels_verdicts_on_a_tpu_audit_are_asked_for_the_tpu():
  # The TPU compile of the example at batch 32 writes its attention
  # probabilities to HBM; the fix offered is pallas_kernels' softmax, whose
  # guard is asked for the audited TPU (its Mosaic TPU kernel), not this CPU.
  from pallas_kernels._src import backend
  from tests.hlo_audit.real_models import tpu_support

  r = hlo_audit.audit_hlo(tpu_support.fixture("example_b32"),
                          options=hlo_audit.AuditOptions(device="v5e"))
  softmax = [f for f in r.findings if f.kernel == "pallas_kernels.softmax"]
  assert softmax and all("mosaic_tpu" in f.guard_verdict for f in softmax), [
      f.guard_verdict for f in softmax]
  for name in ("v5e", "TPU v5 lite", "v6e:2x2"):
    assert backend.resolve_target(name).backend is backend.Backend.TPU
  assert backend.resolve_target("h200").backend is backend.Backend.GPU


def test_a_chain_without_dimension_numbers_to_read_has_no_shape():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.jax_calls import _shape  # pylint: disable=import-outside-toplevel
  module = hlo_audit.parse_hlo(
      "HloModule m, is_scheduled=true\n\nENTRY e {\n"
      "  q = f32[64,32]{1,0} parameter(0)\n  k = f32[32,64]{1,0} parameter(1)\n"
      "  g = f32[64,64]{1,0} custom-call(q, k), custom_call_target=\"__cublas$gemm\"\n"
      "  ROOT a = f32[64,64]{1,0} add(g, g)\n}\n")
  # A library GEMM whose backend config names no dimensions; not a matmul at all.
  for producer in ("g", "a"):
    assert _shape(module, types.SimpleNamespace(computation="e", producer=producer)) is None


def test_only_an_attention_need_is_jaxs_and_a_cross_attention_keeps_its_sides():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.jax_calls import _shape  # pylint: disable=import-outside-toplevel
  assert LIBRARY.kernel_for(types.SimpleNamespace(need=None)).op is None
  module = hlo_audit.parse_hlo(
      "HloModule m, is_scheduled=true\n\nENTRY e {\n"
      "  q = f32[4,64,32]{2,1,0} parameter(0)\n  k = f32[4,128,32]{2,1,0} parameter(1)\n"
      "  ROOT s = f32[4,64,128]{2,1,0} dot(q, k), lhs_batch_dims={0}, "
      "lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}\n}\n")
  # 64 queries over 128 keys, the softmax along the keys: as the dot has them.
  for boundary in ("f32[4,64,128]", ""):
    got = _shape(module, types.SimpleNamespace(computation="e", producer="s",
                                               boundary_shape=boundary))
    assert (got.batch, got.queries, got.keys, got.head_dim) == ((4,), 64, 128, 32)

"""The seam to kernel libraries: found by entry point, asked through a
protocol, and never needed: without one the audit still names each gap's
kernel; a broken one is a note."""

from __future__ import annotations

import importlib.metadata

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind, plugins
from hlo_audit._src.analysis import kernel_library


def _epilogue():
  x, w, b = jnp.ones((64, 256)), jnp.ones((256, 512)), jnp.ones((512,))
  return jax.jit(lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False)), (x, w, b)


def _layer_norm(x, g, b):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def _audit(fn, *args, **options):
  cap = hlo_audit.capture(fn, *args)
  return hlo_audit.audit_hlo(cap, options=hlo_audit.AuditOptions(**options))


@pytest.fixture
def discovered(monkeypatch):
  """Makes discovery see the given entry points (and forget the real ones)."""

  def use(*entry_points):
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: list(entry_points)
                        if group == plugins.ENTRY_POINT_GROUP else [])
    return plugins.installed_libraries(refresh=True)

  yield use
  monkeypatch.undo()
  plugins.installed_libraries(refresh=True)


def _entry_point(name, value):
  return importlib.metadata.EntryPoint(name=name, value=value,
                                       group=plugins.ENTRY_POINT_GROUP)


class FakeLibrary:
  """A library of one op, `fake.fused_dot`, that closes epilogues."""

  name = "fake"
  scope_prefix = "fake."

  def kernel_for(self, finding):
    need = finding.need
    if need.kind is FindingKind.UNFUSED_EPILOGUE and need.anchor == "dot":
      return plugins.KernelChoice("fake.fused_dot")
    return plugins.KernelChoice(None, "fake.fused_dot fuses epilogues only")

  def suggest(self, finding, module):
    anchor = plugins.matmul_anchor(module, finding.computation, finding.producer)
    return plugins.Suggestion(f"fake.fused_dot({anchor.lhs}, {anchor.rhs})", "runs")

  def sweep_targets(self):
    return {}

  def swap(self, fn, **options):
    return fn

  def verify(self, baseline, candidate, *args, **options):
    return None


class RaisingLibrary(FakeLibrary):

  def suggest(self, finding, module):
    raise RuntimeError("boom")


FAKE = FakeLibrary()
RAISING = RaisingLibrary()
NOT_A_LIBRARY = object()


def test_without_a_library_each_gap_names_the_kernel_it_needs():
  fn, args = _epilogue()
  r = _audit(fn, *args, kernel_libraries=())
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.kernel is None and f.suggestion == "" and f.guard_verdict == ""
  assert f.need == plugins.KernelNeed(FindingKind.UNFUSED_EPILOGUE, "dot",
                                      ("bias", "activation:gelu"))
  assert f.guard == ("a dot kernel with its epilogue (bias, activation:gelu) fused would "
                     "close it; no kernel library is installed")
  assert any(n.startswith("no kernel library is installed") for n in r.notes)
  assert r.kernel_libraries == ()
  assert "swap(fn)" not in r.to_text()
  r = _audit(jax.jit(_layer_norm), jnp.ones((64, 256)), jnp.ones(256), jnp.ones(256),
             kernel_libraries=())
  (f,) = r.findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.kernel is None
  assert f.evidence.endswith("; a fused layer norm kernel would close it; no kernel "
                             "library is installed")


def test_with_the_installed_library_it_names_the_op_and_no_note():
  fn, args = _epilogue()
  r = _audit(fn, *args)
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.kernel == "pallas_kernels.matmul"
  assert f.guard == "pallas_kernels.matmul runs XLA's reference outside its shape/dtype rules"
  assert r.kernel_libraries == ("pallas_kernels",)
  assert not any("kernel librar" in n for n in r.notes)
  assert "pallas_kernels.swap(fn)" in r.to_text()


def test_a_plugged_in_library_closes_and_suggests(discovered):
  libs = discovered(_entry_point("fake", f"{__name__}:FAKE"))
  assert libs.libraries == (FAKE,) and not libs.notes
  fn, args = _epilogue()
  r = _audit(fn, *args)
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.kernel == "fake.fused_dot"
  assert f.suggestion == "fake.fused_dot(f32[64,256], f32[256,512])"
  assert f.guard_verdict == "runs"
  assert r.kernel_libraries == ("fake",) and "fake.swap(fn)" in r.to_text()
  # Its reason reaches the findings it cannot close.
  r = _audit(jax.jit(_layer_norm), jnp.ones((64, 256)), jnp.ones(256), jnp.ones(256))
  (f,) = r.findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.kernel is None
  assert f.evidence.endswith("; no kernel yet: fake.fused_dot fuses epilogues only")


def test_a_library_that_fails_is_a_note_not_a_crash(discovered):
  libs = discovered(_entry_point("broken", "no_such_module_anywhere:LIB"),
                    _entry_point("odd", f"{__name__}:NOT_A_LIBRARY"),
                    _entry_point("raising", f"{__name__}:RAISING"))
  assert libs.libraries == (RAISING,)
  assert libs.notes[0].startswith("kernel library 'broken' failed to load "
                                  "(no_such_module_anywhere:LIB): ModuleNotFoundError")
  assert "'odd'" in libs.notes[1] and "does not implement" in libs.notes[1]
  fn, args = _epilogue()
  r = _audit(fn, *args)
  assert r.notes[:2] == libs.notes
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.kernel == "fake.fused_dot" and f.suggestion == ""
  assert f.guard_verdict == "guard not evaluated: fake failed: RuntimeError: boom"


def test_libraries_are_chosen_by_name():
  libs = plugins.installed_libraries(("pallas_kernels", "nope"))
  assert [lib.name for lib in libs.libraries] == ["pallas_kernels"]
  assert libs.notes == ("kernel libraries not installed: nope",)


def test_needs_describe_their_kernel():
  need = plugins.KernelNeed
  assert need(FindingKind.UNFUSED_PROLOGUE, "dot", ("dequantize:s8",)).describe() == (
      "a dot kernel with its prologue (dequantize:s8) fused")
  assert need(FindingKind.UNFUSED_EPILOGUE, "dot", ("bias",), outputs=2).describe() == (
      "a dot kernel with its epilogue (bias) fused writing 2 outputs")
  assert need(FindingKind.MATERIALIZED_SLICE, "dot", ("concatenate",),
              reads_parts=True).describe() == "a dot kernel that reads the parts in place"
  assert kernel_library.NO_LIBRARY == "no kernel library is installed"


def test_a_cublas_calls_anchor_carries_its_dot_dimension_numbers():
  # XLA:GPU with Triton gemms off (flax's MLP on an H200): cuBLASLt calls
  # hold their dot's dimension numbers in the backend config. dh = dy @
  # w2^T contracts both operands' dimension 1; dW = x^T @ dy both's 0.
  from tests.hlo_audit.real_models import h200_support
  module = hlo_audit.parse_hlo(h200_support.fixture("cublas_mlp"))
  entry = module.entry.name
  dx = plugins.matmul_anchor(module, entry, "custom-call.11")
  assert (str(dx.lhs), str(dx.rhs), dx.result) == ("f32[128,16]", "f32[512,16]", (128, 512))
  assert (dx.lhs_contracting, dx.rhs_contracting, dx.lhs_batch) == ((1,), (1,), ())
  dw = plugins.matmul_anchor(module, entry, "custom-call.14")
  assert (dw.lhs_contracting, dw.rhs_contracting) == ((0,), (0,))

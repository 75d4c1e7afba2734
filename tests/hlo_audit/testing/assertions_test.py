"""hlo_audit.testing: each assertion passes on a fused program and fires,
with the offending rows and sources, when the fusion is undone on purpose."""

from __future__ import annotations

import dataclasses
import re
import types

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
import pallas_kernels as pk
from hlo_audit import testing

S = jax.ShapeDtypeStruct
X, W, B = S((128, 256), jnp.float32), S((256, 512), jnp.float32), S((512,), jnp.float32)
# Big enough for the Pallas kernel's grid to be a loop XLA keeps.
XL, WL = S((256, 256), jnp.float32), S((256, 1024), jnp.float32)


def row_max(x, w):
  # XLA's CPU backend runs the reduction in the matmul's kernel (one YNN fusion).
  return jnp.max(x @ w, axis=-1)


def row_max_split(x, w):
  # The same math with a kernel boundary after the matmul: a custom kernel
  # whose result XLA cannot fuse into, as a refactor might introduce.
  return jnp.max(pk.matmul(x, w, implementation="pallas", interpret=True), axis=-1)


def row_max_callback(x, w):
  # A custom-call boundary between the matmul and its reduction.
  y = x @ w
  y = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
  return jnp.max(y, axis=-1)


def mlp(x, w, b):
  return jax.nn.gelu(x @ w + b, approximate=False)


def test_assert_fused_passes_when_the_reduction_runs_in_the_matmul_kernel():
  r = testing.assert_fused(row_max, XL, WL, op="reduce_max", into="dot")
  assert len(r.kernels) == 1


def test_assert_fused_fires_when_the_epilogue_is_unfused_on_purpose():
  with pytest.raises(AssertionError) as e:
    testing.assert_fused(row_max_split, XL, WL, op="reduce_max", into="dot")
  msg = str(e.value)
  line = row_max_split.__code__.co_firstlineno + 3
  assert "'reduce_max' runs outside the 'dot' kernel in 1 kernel(s)" in msg
  assert re.search(r"reading f32\[(1,)?256,1024\] written by pallas kernel", msg), msg
  assert re.search(rf"assertions_test\.py:{line}\b", msg), msg
  with pytest.raises(AssertionError, match="'reduce_max' runs outside the 'dot' kernel"):
    testing.assert_fused(row_max_callback, XL, WL, op="reduce_max", into="dot")


def test_assert_fused_fails_when_nothing_runs_the_op():
  with pytest.raises(AssertionError, match="no kernel runs 'gelu'"):
    testing.assert_fused(row_max, X, W, op="gelu", into="dot")


# cuBLAS on a GPU: the same matmul + bias + GELU, fused into cuBLASLt's
# epilogue, and left to a loop fusion after a plain gemm.
GPU_FUSED = """HloModule fused, is_scheduled=true
ENTRY %main (x: f32[64,32], w: f32[32,128], b: f32[128]) -> f32[64,128] {
  %x = f32[64,32]{1,0} parameter(0)
  %w = f32[32,128]{1,0} parameter(1)
  %b = f32[128]{0} parameter(2)
  %lt = (f32[64,128]{1,0}, s8[1024]{0}) custom-call(%x, %w, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"epilogue":"BIAS_GELU"}}, metadata={op_name="jit(f)/dot_general" source_file="/src/model.py" source_line=9}
  ROOT %out = f32[64,128]{1,0} get-tuple-element(%lt), index=0
}
"""

GPU_UNFUSED = """HloModule unfused, is_scheduled=true
%fused_gelu (p0: f32[64,128], p1: f32[128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %bb = f32[64,128]{1,0} broadcast(%p1), dimensions={1}
  %add = f32[64,128]{1,0} add(%p0, %bb), metadata={op_name="jit(f)/add"}
  ROOT %erf = f32[64,128]{1,0} erf(%add), metadata={op_name="jit(f)/erf"}
}

ENTRY %main (x: f32[64,32], w: f32[32,128], b: f32[128]) -> f32[64,128] {
  %x = f32[64,32]{1,0} parameter(0)
  %w = f32[32,128]{1,0} parameter(1)
  %b = f32[128]{0} parameter(2)
  %gemm = (f32[64,128]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/dot_general" source_file="/src/model.py" source_line=9}, backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"epilogue":"DEFAULT"}}
  %gte = f32[64,128]{1,0} get-tuple-element(%gemm), index=0
  ROOT %fusion = f32[64,128]{1,0} fusion(%gte, %b), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(f)/erf" source_file="/src/model.py" source_line=9}
}
"""


def test_where_keeps_the_kernels_of_a_source_file():
  # The row max's kernels come from this file: kept, and fused.
  testing.assert_fused(row_max, XL, WL, op="reduce_max", into="dot",
                       where="assertions_test.py")
  with pytest.raises(AssertionError, match="no kernel runs 'reduce_max'"):
    testing.assert_fused(row_max, XL, WL, op="reduce_max", into="dot", where="elsewhere.py")


def test_matmul_names_the_same_kernels_as_dot():
  testing.assert_fused(row_max, XL, WL, op="reduce_max", into="matmul")
  testing.assert_fused(hlo_audit.parse_hlo(GPU_FUSED), op="gelu", into="matmul")


def test_gelu_epilogue_in_cublaslt_passes_and_a_separate_gelu_fusion_fires():
  testing.assert_fused(hlo_audit.parse_hlo(GPU_FUSED), op="gelu", into="dot")
  testing.assert_no_findings(hlo_audit.parse_hlo(GPU_FUSED), kinds="unfused-epilogue")
  unfused = hlo_audit.parse_hlo(GPU_UNFUSED)
  with pytest.raises(AssertionError) as e:
    testing.assert_fused(unfused, op="gelu", into="dot")
  assert "loop fusion fusion, reading f32[64,128] written by library call gemm" in str(e.value)
  assert "/src/model.py:9" in str(e.value)
  with pytest.raises(AssertionError) as e:
    testing.assert_no_findings(unfused, kinds="unfused-epilogue")
  assert "1 finding(s) (unfused-epilogue)" in str(e.value)
  assert re.search(r"unfused epilogue\s+f32\[64,128\].*/src/model\.py:9", str(e.value))


def test_assert_fused_failure_lists_the_finding_that_names_the_op_among_others():
  # The unfused epilogue after the gemm applies ("bias", "activation:gelu"):
  # it names gelu beside the bias, so asserting gelu fused must list it.
  with pytest.raises(AssertionError) as e:
    testing.assert_fused(hlo_audit.parse_hlo(GPU_UNFUSED), op="gelu", into="dot")
  msg = str(e.value)
  assert "findings:" in msg, msg
  assert re.search(r"unfused epilogue\s+f32\[64,128\].*/src/model\.py:9", msg), msg


def test_assert_no_findings_filters_by_class_bytes_and_source():
  r = hlo_audit.audit(mlp, X, W, B)   # one 512 KiB unfused epilogue
  with pytest.raises(AssertionError, match=r"unfused epilogue .*assertions_test\.py:\d+"):
    testing.assert_no_findings(r)
  testing.assert_no_findings(r, kinds=["standalone-copy", "layout-conflict"])
  testing.assert_no_findings(r, min_bytes="1MiB")
  with pytest.raises(AssertionError):
    testing.assert_no_findings(r, min_bytes="512KiB")
  testing.assert_no_findings(r, where="elsewhere.py")
  with pytest.raises(AssertionError):
    testing.assert_no_findings(r, where="assertions_test.py")
  testing.assert_no_findings(r, where=lambda f: f.bytes_saved > 10 ** 6)
  testing.assert_no_copies(r)


def test_a_library_kernel_runs_a_dot_when_its_detail_names_any_library_word():
  from hlo_audit._src.analysis.backend_traits import KernelKind  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.testing.assertions import _runs  # pylint: disable=import-outside-toplevel
  cublas = types.SimpleNamespace(detail="__cublas$gemm", kind=KernelKind.LIBRARY_CALL)
  assert _runs("dot", frozenset(), cublas)
  assert not _runs("gelu", frozenset(), cublas)


def test_assert_kernel_count_and_peak():
  r = hlo_audit.audit(mlp, X, W, B)
  testing.assert_kernel_count(r, at_most=2)
  testing.assert_kernel_count(r, at_least=2, at_most=2)  # both bounds inclusive
  testing.assert_kernel_count(r, at_least=2)  # either bound alone
  with pytest.raises(AssertionError, match=r"2 kernels .* expected at least 3"):
    testing.assert_kernel_count(r, at_least=3)
  with pytest.raises(AssertionError, match=r"2 kernels .* expected at most 1"):
    testing.assert_kernel_count(r, at_most=1)
  testing.assert_peak_below(r, bytes=r.peak_bytes + 1)
  with pytest.raises(AssertionError, match="is not below") as e:
    testing.assert_peak_below(r, bytes=r.peak_bytes)
  assert "live at the peak" in str(e.value) and "f32[256,512]" in str(e.value)
  # The largest buffers first: the weight, the input, the bias.
  shapes = re.findall(r"f32\[[0-9,]+\]", str(e.value).split("live at the peak:", 1)[1])
  assert shapes == ["f32[256,512]", "f32[128,256]", "f32[512]"]
  # Under its column headings, each buffer's lifetime class in its row.
  table = str(e.value).split("live at the peak:", 1)[1].strip().splitlines()
  assert table[0].split() == ["bytes", "shape", "lifetime", "source"]
  assert table[1].split()[2:4] == ["f32[256,512]", "input"]
  with pytest.raises(TypeError):
    testing.assert_kernel_count(r)
  # Too few is said as such; bounds no count meets are the caller's slip.
  with pytest.raises(AssertionError, match=r"2 kernels .* expected at least 3"):
    testing.assert_kernel_count(r, at_least=3, at_most=5)
  with pytest.raises(TypeError, match="at_least=3 is above at_most=2"):
    testing.assert_kernel_count(r, at_least=3, at_most=2)


def test_a_failure_names_the_classes_it_found_in_order():
  report = hlo_audit.audit_hlo(GPU_UNFUSED)
  (f,) = report.findings_of(hlo_audit.FindingKind.UNFUSED_EPILOGUE)
  copy = dataclasses.replace(f, kind=hlo_audit.FindingKind.STANDALONE_COPY)
  both = dataclasses.replace(report, findings=(f, copy))
  with pytest.raises(AssertionError, match=r"2 finding\(s\) \(standalone-copy, unfused-epilogue\) "
                                           r"in 2 group\(s\)"):
    testing.assert_no_findings(both)


def test_a_function_may_take_a_target_and_a_report_may_not():
  with pytest.raises(TypeError, match="target= compiles a function; a AuditReport"):
    testing.assert_no_findings(hlo_audit.audit_hlo(GPU_UNFUSED), target="h200")
  try:  # without the CUDA plugin the target's own error; with it, an audit
    testing.assert_kernel_count(mlp, X, W, B, at_least=1, target="h200")
  except hlo_audit.HloAuditError as e:
    assert "compiles a function" not in str(e)


def test_a_snapshot_keeps_what_it_can_fix_above_the_floor_and_every_verdict_else():
  from hlo_audit._src.testing import snapshot as snap  # pylint: disable=import-outside-toplevel
  report = hlo_audit.audit_hlo(GPU_UNFUSED)
  (f,) = report.findings_of(hlo_audit.FindingKind.UNFUSED_EPILOGUE)
  keep = dataclasses.replace(f, kind=hlo_audit.FindingKind.KEEP_REUSE, boundary="k")
  fused = dataclasses.replace(f, kind=hlo_audit.FindingKind.ALREADY_FUSED, boundary="a")
  three = dataclasses.replace(report, findings=(f, keep, fused))

  def classes(min_bytes):
    return sorted(e["class"] for e in snap.snapshot_of(three, "/", min_bytes))

  # A buffer worth keeping is advice, never a snapshot's line.
  assert classes(0) == ["already-fused", "unfused-epilogue"]
  # Past the floor the fix goes; what is not actionable stays whatever its size.
  assert classes(f.bytes_saved + 1) == ["already-fused"]


def test_an_op_no_kernel_runs_lists_the_names_an_op_may_have():
  with pytest.raises(AssertionError) as e:
    testing.assert_fused(row_max, XL, WL, op="no_such_op", into="dot")
  assert str(e.value).endswith(
      "one of ['dot', 'gelu', 'matmul', 'relu', 'sigmoid', 'silu', 'softmax'])")


def test_an_op_fused_into_its_kernel_still_fails_on_a_finding_naming_it():
  fused = hlo_audit.audit_hlo(GPU_FUSED)
  testing.assert_fused(fused, op="gelu", into="dot")
  (gap,) = hlo_audit.audit_hlo(GPU_UNFUSED).findings_of(hlo_audit.FindingKind.UNFUSED_EPILOGUE)
  with pytest.raises(AssertionError):
    testing.assert_fused(dataclasses.replace(fused, findings=(*fused.findings, gap)),
                         op="gelu", into="dot")


def test_an_op_s_kernel_may_run_exactly_its_signature():
  # A lone logistic, unfused: its kernel runs {logistic}, sigmoid's signature.
  lone = hlo_audit.parse_hlo("HloModule m, is_scheduled=true\n\nENTRY e {\n"
                             "  p = f32[64,128]{1,0} parameter(0)\n"
                             "  ROOT l = f32[64,128]{1,0} logistic(p)\n}\n")
  testing.assert_fused(lone, op="sigmoid", into="logistic")


@pytest.mark.parametrize("content", ['[{"version": 2}]', '{"version": 0, "findings": []}',
                                     '{"findings": []}', '"snapshot"'])
def test_a_file_that_is_not_a_snapshot_of_this_version_is_refused(tmp_path, content):
  from hlo_audit._src.testing import snapshot as snap  # pylint: disable=import-outside-toplevel
  path = tmp_path / "s.json"
  path.write_text(content)
  with pytest.raises(ValueError, match=f"s.json: not an hlo-audit snapshot of version "
                                       f"{snap.SNAPSHOT_VERSION}"):
    snap.read_snapshot(str(path))


def test_a_kernel_apart_is_shown_the_first_buffer_a_source_kernel_wrote_for_it():
  from hlo_audit._src.testing.assertions import _inputs_from  # pylint: disable=import-outside-toplevel
  kind = types.SimpleNamespace(value="library call")

  def kernel(name):
    return types.SimpleNamespace(name=name, kind=kind)

  def buffer(shape, producer, consumers):
    return types.SimpleNamespace(shape=shape, producer=producer, consumers=consumers)

  gemm, gemm2, other, apart = map(kernel, ("gemm", "gemm2", "other", "apart"))
  report = types.SimpleNamespace(
      kernels=[gemm, gemm2, other, apart],
      buffers=[buffer("f32[1]", "other", ("apart",)),   # not a source's
               buffer("f32[2]", "gemm", ("apart",)),    # the first source's
               buffer("f32[3]", "gemm2", ("apart",)),   # a later one's
               buffer("f32[4]", None, ("apart",))])     # a parameter
  got = _inputs_from(report, [apart], lambda k: k.name.startswith("gemm"))
  assert got == {"apart": ("f32[2]", "library call gemm")}

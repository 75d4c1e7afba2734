"""XLA:GPU's split-K gemms, on committed H200 compiles: the partial sums are
found with their gemm, k and the result's bytes in the program's dtype, and
an `unsplit` what-if replaces them by that result (as a kernel replacing
the gemm writes it)."""

from __future__ import annotations

import functools

import pytest

import hlo_audit
from hlo_audit import WhatIfError
from tests.hlo_audit.real_models import h200_support


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name))


def test_the_partial_sums_of_each_split_k_gemm_are_found():
  report = _report("example")
  buffers = {b.name: b for b in report.buffers}
  found = report.split_k
  assert len(found) == 13
  assert [s.bytes for s in found] == sorted((s.bytes for s in found), reverse=True)
  for s in found:
    partials = buffers[s.partials]
    # f32[k, M, N], written by the gemm fusion, summed over k by its readers.
    assert partials.dtype == "f32" and partials.dims[0] == s.splits >= 2, partials
    assert s.gemm == partials.producer and "dot" in report.program.kernels[s.gemm].fused_ops
    assert set(s.readers) <= set(partials.consumers)
    assert s.result_bytes * s.splits == s.bytes  # the example's dots are f32
  top = found[0]
  assert (top.partials, top.splits, top.bytes) == ("gemm_fusion_dot.52", 8, 4 << 20)


def test_a_bf16_gemms_result_is_counted_in_bf16():
  # The partial sums are float32; the sum of a bf16 dot is converted to bf16
  # right after the reduce, and that is what a kernel replacing it writes.
  # BERT's weight gradients stay float32 (its parameters are).
  found = {s.partials: s for s in _report("bert_mlm").split_k}
  halves = {n for n, s in found.items() if s.result_bytes * s.splits * 2 == s.bytes}
  whole = {n for n, s in found.items() if s.result_bytes * s.splits == s.bytes}
  assert halves | whole == set(found) and len(halves) == 6 and len(whole) == 9
  assert "gemm_fusion_dot.103" in halves and "gemm_fusion_dot.116" in whole


def test_gemms_that_do_not_split_hold_none():
  assert _report("cublas_mlp").split_k == ()  # cuBLASLt calls, no Triton gemm


def test_unsplit_replaces_the_partial_sums_by_the_result():
  report = _report("example")
  base = report.what_if()
  whole = report.what_if(unsplit=[s.partials for s in report.split_k])
  assert whole.peak_bytes < base.peak_bytes
  assert len(whole.changes) == 13 and whole.changes[0].startswith("unsplit gemm_fusion_dot.")
  # Between dropping the partial sums and keeping them: the result stays.
  for s in report.split_k[:4]:
    dropped = report.what_if(drop=[s.partials]).peak_bytes
    unsplit = report.what_if(unsplit=[s.partials]).peak_bytes
    assert dropped <= unsplit <= base.peak_bytes
    assert unsplit - dropped <= s.result_bytes
  # At the peak the largest partials are live: unsplitting it saves there.
  top = report.split_k[0]
  if top.partials in base.live_at_peak:
    assert report.what_if(unsplit=[top.partials]).peak_bytes < base.peak_bytes


def test_unsplit_of_a_buffer_fused_or_dropped_writes_no_result():
  # A fusion (or drop) that removes the partial sums removes the result too.
  report = _report("example")
  for s in report.split_k[:3]:
    dropped = report.what_if(drop=[s.partials])
    both = report.what_if(drop=[s.partials], unsplit=[s.partials])
    assert both.timeline == dropped.timeline and both.peak_bytes == dropped.peak_bytes


def test_unsplit_names_what_is_no_split_k_sum():
  report = _report("example")
  other = next(b.name for b in report.buffers
               if b.producer and b.name not in {s.partials for s in report.split_k})
  with pytest.raises(WhatIfError, match=r"holds no gemm's split-K partial sums.*gemm_fusion_dot"):
    report.what_if(unsplit=[other])
  with pytest.raises(WhatIfError, match="no buffer"):
    report.what_if(unsplit=["no_such_buffer"])


def test_the_cli_replays_an_unsplit_gemm(tmp_path, capsys):
  import json

  from hlo_audit._src.cli.main import ExitCode, run

  path = tmp_path / "example.hlo"
  path.write_text(h200_support.fixture("example"))
  assert run(["file", str(path), "--json", "--what-if", "unsplit=gemm_fusion_dot.52"]) \
      == ExitCode.OK
  what_if = json.loads(capsys.readouterr().out)["what_if"]
  assert what_if["changes"] == ["unsplit gemm_fusion_dot.52 (8 partial sums, "
                                "4194304 -> 524288 B)"]
  assert run(["file", str(path), "--what-if", "unsplit=loop_add_fusion"]) == ExitCode.USAGE
  assert "holds no gemm's split-K partial sums" in capsys.readouterr().err

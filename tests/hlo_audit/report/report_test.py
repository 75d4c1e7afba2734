"""The report's renderers and diff, on the audit of a small function."""

from __future__ import annotations

import dataclasses
import functools
import json
import types

import jax
import jax.numpy as jnp
import pytest
from rich.console import Console

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.report.json_report import report_from_dict

S = jax.ShapeDtypeStruct


def mlp(x, w, b):
  return jax.nn.relu(x @ w + b)


@functools.cache
def rep():
  return hlo_audit.audit(mlp, S((64, 128), jnp.float32), S((128, 256), jnp.float32),
                         S((256,), jnp.float32))


def test_json_schema_has_the_documented_fields():
  d = json.loads(rep().to_json())
  assert d["schema_version"] == 4
  for key in ("module", "kernels", "buffers", "findings", "peak_bytes",
              "xla_peak_bytes", "intermediates", "timeline", "timing"):
    assert key in d
  # On this machine's CPU: every kernel priced, the step their sum.
  assert d["timing"]["device"]["platform"] == "cpu"
  assert len(d["timing"]["kernels"]) == len(d["kernels"])
  assert d["timing"]["step_time"] > 0
  assert all("time_saved" in f for f in d["findings"])
  (f,) = [f for f in d["findings"] if f["class"] == "unfused-epilogue"]
  assert f["bytes_saved"] == 2 * 64 * 256 * 4 and f["launches_removed"] == 1
  assert f["source"].endswith("report_test.py:" + str(mlp.__code__.co_firstlineno + 1))
  assert f["kernel"] == "pallas_kernels.matmul"
  assert set(f["ops"]) == {"bias", "activation:relu"}
  assert f["peak_after"] + f["peak_saved"] == d["peak_bytes"]


def test_json_round_trip_and_diff_with_itself_is_empty():
  r = rep()
  again = report_from_dict(json.loads(r.to_json()))
  assert again.findings == r.findings and again.buffers == r.buffers
  assert r.diff(again).unchanged


#: What a saved report does not hold: the parsed module, the options of the
#: audit and the kernel libraries it looked for.
NOT_SAVED = {"program", "options", "kernel_libraries"}


@pytest.mark.parametrize("audit", ["mlp", "transformer", "async-gathers"])
def test_a_saved_report_reads_back_field_for_field(audit):
  from tests.hlo_audit.report.trace_test import gathers, transformer  # pylint: disable=import-outside-toplevel
  r = {"mlp": rep, "transformer": transformer, "async-gathers": gathers}[audit]()
  again = report_from_dict(json.loads(r.to_json()))
  differ = [f.name for f in dataclasses.fields(r)
            if f.name not in NOT_SAVED and getattr(again, f.name) != getattr(r, f.name)]
  assert not differ, differ
  assert r.timing is not None and again.timing.kernels == r.timing.kernels
  if audit == "async-gathers":
    assert again.collectives and again.collectives == r.collectives


def test_json_round_trip_keeps_allocations_and_heap_apart():
  # The peak splits into allocations and heap; a saved report read back
  # must say the same split, not one number twice.
  r = dataclasses.replace(rep(), heap_peak_bytes=4096)
  assert r.allocation_bytes not in (0, r.heap_peak_bytes)
  again = report_from_dict(json.loads(r.to_json()))
  assert (again.allocation_bytes, again.heap_peak_bytes) == (r.allocation_bytes, 4096)
  assert again.summary() == r.summary()


def test_json_writes_each_frame_once_and_reads_schema_2_inline_stacks():
  r = rep()
  d = json.loads(r.to_json())
  rows = d["kernels"] + d["buffers"] + d["findings"]
  stacks = [row["source_stack"] for row in rows if row["source_stack"]]
  assert stacks and all(isinstance(i, int) for s in stacks for i in s)
  assert len({json.dumps(f, sort_keys=True) for f in d["frames"]}) == len(d["frames"])
  for row, mine in zip(d["kernels"], r.kernels):
    assert [d["frames"][i] for i in row["source_stack"]] == [
        {"file": f.file, "line": f.line, "column": f.column, "function": f.function}
        for f in mine.source_stack]
  # What schema 2 wrote: each row's frames inline, no table.
  old = {**d, "schema_version": 2}
  for key in ("kernels", "buffers", "findings"):
    old[key] = [{**row, "source_stack": [d["frames"][i] for i in row["source_stack"]]}
                for row in d[key]]
  del old["frames"]
  again = report_from_dict(old)
  assert [k.source_stack for k in again.kernels] == [k.source_stack for k in r.kernels]
  assert [f.source_stack for f in again.findings] == [f.source_stack for f in r.findings]
  assert r.diff(again).unchanged


def test_schema_3_reads_its_frame_table_and_no_time_estimate():
  # What schema 3 wrote: the frame table of 4, no time estimates.
  r = rep()
  d = json.loads(r.to_json())
  old = {**d, "schema_version": 3, "findings": [
      {k: v for k, v in f.items() if k != "time_saved"} for f in d["findings"]]}
  del old["timing"]
  again = report_from_dict(old)
  assert again.timing is None and all(f.time_saved is None for f in again.findings)
  stacks = [k.source_stack for k in again.kernels]
  assert any(stacks) and stacks == [k.source_stack for k in r.kernels]
  assert [b.source_stack for b in again.buffers] == [b.source_stack for b in r.buffers]


def test_a_finding_saved_without_boundary_kept_reads_as_not_kept():
  # A report saved before findings said whether later readers keep their
  # boundary: none is read as kept (a kept boundary would change the fix).
  r = rep()
  d = json.loads(r.to_json())
  assert d["findings"] and not any(f["boundary_kept"] for f in d["findings"])
  d["findings"][0]["boundary_kept"] = True
  again = report_from_dict(d)
  assert again.findings[0].boundary_kept is True
  for f in d["findings"]:
    del f["boundary_kept"]
  assert not any(f.boundary_kept for f in report_from_dict(d).findings)


def test_diff_names_what_vanished():
  before = rep()
  after = hlo_audit.audit(lambda x, w: x @ w, S((64, 128), jnp.float32),
                          S((128, 256), jnp.float32))
  d = before.diff(after)
  assert d.kernel_count_delta == -1
  assert [f.kind for f in d.findings_removed] == [FindingKind.UNFUSED_EPILOGUE]
  assert not d.findings_added
  assert d.materialized_bytes_delta == -64 * 256 * 4
  assert "findings removed (1)" in str(d)


def test_markdown_and_terminal_show_tables_and_records():
  md = rep().to_markdown()
  assert md.startswith("# hlo-audit: `jit_mlp`")
  assert "| Buffer | Shape | Dtype | Bytes |" in md
  assert "**logical bytes saved**: 128.00 KiB of HBM traffic per run" in md
  # One finding in its group: no members line; two at one line: both listed.
  assert "**members**" not in md
  (f,) = rep().findings
  two = dataclasses.replace(rep(), findings=(f, dataclasses.replace(f, boundary="copy.9")))
  members = [l for l in two.to_markdown().splitlines() if l.startswith("- **members**")]
  assert members == [f"- **members**: {f.boundary} (128.00 KiB), copy.9 (128.00 KiB)"], members
  console = Console(record=True, width=160)
  rep().print(console, all=True)
  text = console.export_text()
  assert "Intermediate tensors" in text and "Findings (fusion decision records)" in text
  assert "pallas_kernels.matmul" in text
  assert "peak" in text and "XLA's" in text
  assert str(rep()).count("unfused epilogue") >= 1


def test_kernel_table_names_a_kernels_commonest_fused_ops_first():
  from hlo_audit._src.report.text import kernel_rows  # pylint: disable=import-outside-toplevel
  r = rep()
  k = dataclasses.replace(r.kernels[0], fused_ops={
      "add": 1, "exponential": 5, "multiply": 3, "select": 2, "negate": 1, "divide": 4,
      "convert": 1, "maximum": 6})
  row = kernel_rows(dataclasses.replace(r, kernels=(k,)))[0]
  # The six commonest, commonest first: one op of count 1 is left out, and
  # an op once is named without a count.
  assert row[3].startswith("maximumx6, exponentialx5, dividex4, multiplyx3, selectx2, ")
  assert row[3].rsplit(", ", 1)[1] in ("add", "negate", "convert")


def test_a_fix_saving_no_time_is_not_said_to_cost_time():
  from hlo_audit._src.report.text import _time_saved  # pylint: disable=import-outside-toplevel
  said = [_time_saved(types.SimpleNamespace(time_saved=t)) for t in (0.0, -1e-6, 2e-6, None)]
  assert said == ["~0 s per step (estimated)", "costs ~1.00 us per step (estimated)",
                  "~2.00 us per step (estimated)", "not estimated (the device is unknown)"]


def test_terminal_ranks_by_traffic_when_no_fix_has_a_time_estimate():
  # On an unknown device no group has a time saved: the table is ranked by
  # memory traffic and its title must say so, not claim an estimated time.
  timed = rep().to_text(160)
  assert "finding groups, by estimated time saved per step" in timed
  r = dataclasses.replace(rep(), timing=None, findings=tuple(
      dataclasses.replace(f, time_saved=None) for f in rep().findings))
  for sort in ("time", "bytes"):
    out = r.to_text(160, sort=sort)
    assert "finding groups, by memory traffic saved per step" in out, sort
    assert "estimated time saved" not in out, sort


def test_summary_counts_kernels_by_kind():
  s = rep().summary()
  assert "kernels: 2 (1 cpu library fusion, 1 loop fusion)" in s
  assert "findings: 1 (1 unfused epilogue)" in s


def test_html_is_self_contained(tmp_path):
  path = tmp_path / "r.html"
  page = rep().to_html(str(path))
  assert path.read_text() == page
  assert page.startswith("<!DOCTYPE html>")
  assert "<svg" in page and "peak" in page
  assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
  assert "https://" not in page


def test_json_round_trip_keeps_every_peak_figure_apart():
  # Each of the report's peak figures distinct, so that one read from its
  # neighbour's key shows.
  r = dataclasses.replace(rep(), peak_bytes=1001, xla_peak_bytes=1002,
                          xla_reported_peak_bytes=1003, allocation_bytes=1004,
                          heap_peak_bytes=1005, peak_time=6)
  again = report_from_dict(json.loads(r.to_json()))
  fields = ("peak_bytes", "xla_peak_bytes", "xla_reported_peak_bytes", "allocation_bytes",
            "heap_peak_bytes", "peak_time")
  assert [getattr(again, k) for k in fields] == [1001, 1002, 1003, 1004, 1005, 6]


def test_json_round_trip_keeps_the_target_and_its_notes_apart():
  r = rep()
  r = dataclasses.replace(r, module=dataclasses.replace(
      r.module, target="v5e:2x2", target_notes=("compiled without one", "libtpu 0.0.50")))
  again = report_from_dict(json.loads(r.to_json()))
  assert (again.module.target, again.module.target_notes) == (
      "v5e:2x2", ("compiled without one", "libtpu 0.0.50"))


def test_a_finding_saved_before_findings_had_notes_reads_with_none():
  r = rep()
  d = json.loads(r.to_json())
  for f in d["findings"]:
    del f["notes"]
  assert [f.notes for f in report_from_dict(d).findings] == [()] * len(r.findings)


def test_a_short_list_names_three_and_counts_the_rest():
  from hlo_audit._src.report.text import _short_list  # pylint: disable=import-outside-toplevel
  assert _short_list([]) == "-"
  assert _short_list(["a", "b"]) == "a, b"
  assert _short_list(["a", "b", "c"]) == "a, b, c"
  assert _short_list(["a", "b", "c", "d", "e"]) == "a, b, c +2"


def test_json_round_trip_keeps_a_module_before_optimizations_so():
  r = rep()
  r = dataclasses.replace(r, module=dataclasses.replace(r.module, optimized=False,
                                                        xla_peak_source="buffer assignment"))
  again = report_from_dict(json.loads(r.to_json()))
  assert (again.module.optimized, again.module.xla_peak_source) == (False, "buffer assignment")


def test_a_source_location_saved_without_a_column_has_column_0():
  d = json.loads(rep().to_json())
  located = [f for f in d["findings"] if f.get("source_location")]
  assert located
  for f in located:
    del f["source_location"]["column"]
  again = report_from_dict(d)
  assert all(f.source.column == 0 for f in again.findings if f.source is not None)


def test_kernel_rows_run_longest_first_and_the_table_says_when_it_is_cut():
  import io  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import render_terminal  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.text import kernel_rows  # pylint: disable=import-outside-toplevel
  r = rep()
  times = [r.timing.kernel(row[0]).time for row in kernel_rows(r)]
  assert len(times) >= 2 and times == sorted(times, reverse=True)
  untimed = dataclasses.replace(r, timing=None)
  moved = {k.name: k.bytes_moved for k in r.kernels}
  order = [moved[row[0]] for row in kernel_rows(untimed)]
  assert order == sorted(order, reverse=True)
  # To a text stream (no rich Console): the same text. The title counts
  # "n of all" only when the table is cut.
  out = io.StringIO()
  render_terminal(r, out, all=True, width=200)
  n = len(r.kernels)
  assert f"Kernels by estimated time ({n})" in out.getvalue()
  assert f"({n} of {n})" not in out.getvalue()

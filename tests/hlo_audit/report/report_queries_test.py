"""What a report answers when asked: a buffer or a kernel by name, the bytes
written between kernels, a class by any of its names, and the what-if's
refusals. On XLA:CPU's compile of `relu(x @ w + b)` for f32[64,128] x
f32[128,256]: the dot (a library fusion) writes f32[64,256] (64 KiB) that a
loop fusion reads for the bias and relu."""

from __future__ import annotations

import dataclasses
import re
import types

import pytest

from hlo_audit import FindingKind
from hlo_audit._src.analysis.program import WhatIfError
from hlo_audit._src.report.report import finding_kind
from hlo_audit._src.report.units import fmt_bytes

from tests.hlo_audit.report.report_test import rep  # relu(x @ w + b), audited once


def test_a_buffer_and_a_kernel_by_name_and_what_is_not_there():
  r = rep()
  dot = next(f.boundary for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE)
  assert r.buffer(dot).shape == "f32[64,256]" and r.kernel(dot).name == dot
  with pytest.raises(KeyError, match=f"no buffer 'nope' in the audit of {r.module.name}"):
    r.buffer("nope")
  with pytest.raises(KeyError, match=f"no kernel 'nope' in the audit of {r.module.name}"):
    r.kernel("nope")


def test_materialized_bytes_leave_out_inputs_outputs_and_kernel_internals():
  r = rep()
  # The dot's output alone: the three inputs (160 KiB) and the relu's
  # output (64 KiB) are the caller's.
  assert r.materialized_bytes == 64 * 256 * 4
  dot = r.buffer(r.findings[0].boundary)
  internal = dataclasses.replace(r, buffers=tuple(
      dataclasses.replace(b, internal=True) if b is dot else b for b in r.buffers))
  assert internal.materialized_bytes == 0


def test_a_class_by_its_slug_its_title_or_its_enum_name():
  for name in ("unfused-epilogue", "unfused epilogue", "UNFUSED_EPILOGUE"):
    assert finding_kind(name) is FindingKind.UNFUSED_EPILOGUE
  with pytest.raises(ValueError, match=r"unknown finding class 'epilogue'; known: "
                                       r"standalone-copy, layout-conflict, "):
    finding_kind("epilogue")


def test_what_if_refuses_what_it_cannot_replay_as_a_fusion():
  r = rep()
  (f,) = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  with pytest.raises(WhatIfError, match="fuse: expected findings with a boundary buffer"):
    r.what_if(fuse=[f.boundary])  # a name, not the finding
  with pytest.raises(WhatIfError, match="fuse: expected findings with a boundary buffer"):
    r.what_if(fuse=[dataclasses.replace(f, boundary="")])
  donate = dataclasses.replace(f, kind=FindingKind.UNDONATED_ARGUMENT)
  with pytest.raises(WhatIfError, match=re.escape(
      f"({f.boundary}) is not closed by a fusion; replay it with donate=[{f.boundary!r}]")):
    r.what_if(fuse=[donate])
  exposed = dataclasses.replace(f, kind=FindingKind.EXPOSED_COLLECTIVE)
  with pytest.raises(WhatIfError, match="the replay does not model its change"):
    r.what_if(fuse=[exposed])
  # The finding itself replays: its buffer goes.
  assert r.what_if(fuse=[f]).peak_bytes <= r.peak_bytes


def test_a_kept_boundary_is_a_note_not_a_fusion():
  r = rep()
  (f,) = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  kept = r.what_if(fuse=[dataclasses.replace(f, boundary_kept=True)])
  assert kept.notes[-1] == (f"fuse {f.boundary}: other readers keep the buffer "
                            "(fewer reads, the same memory)")
  assert kept.peak_bytes == r.what_if().peak_bytes


def test_the_on_chip_columns_show_when_any_kernel_moves_bytes_on_chip():
  from hlo_audit._src.report.text import ON_CHIP_COLUMNS, kernel_columns, shows_on_chip  # pylint: disable=import-outside-toplevel
  r = rep()
  assert not shows_on_chip(r) and not set(ON_CHIP_COLUMNS) & set(kernel_columns(r))
  first, *rest = r.timing.kernels
  assert rest  # one kernel of several: any, not all
  one = dataclasses.replace(r, timing=dataclasses.replace(
      r.timing, kernels=(dataclasses.replace(first, on_chip_bytes=4096), *rest)))
  assert shows_on_chip(one)
  columns = kernel_columns(one)
  at = columns.index("Written")
  assert columns[at + 1:at + 3] == ON_CHIP_COLUMNS
  # The terminal's kernel table heads them so, between Written and Runs.
  from hlo_audit._src.report.terminal import render_text  # pylint: disable=import-outside-toplevel
  (head,) = [l for l in render_text(one, width=240, all=True).splitlines()
             if l.lstrip().startswith("Kernel ") and "Written" in l]
  assert head.split()[head.split().index("Written") + 1:][:4] == ["On", "chip", "Scratch",
                                                                  "Runs"], head
  # A kernel's own scratch shows them too, with no estimate at all.
  k, *others = r.kernels
  assert others
  scratch = dataclasses.replace(r, timing=None, kernels=(
      dataclasses.replace(k, on_chip_scratch=1024), *others))
  assert shows_on_chip(scratch)
  assert not shows_on_chip(dataclasses.replace(r, timing=None))


def test_the_summary_names_the_device_where_it_is_not_the_platform():
  from hlo_audit._src.report.terminal import render_text  # pylint: disable=import-outside-toplevel
  r = rep()
  assert render_text(r, width=100).splitlines()[0] == f"hlo-audit: {r.module.name} on cpu"
  gpu = dataclasses.replace(r, module=dataclasses.replace(
      r.module, platform="cuda", device_kind="NVIDIA H200"))
  assert render_text(gpu, width=100).splitlines()[0] == (
      f"hlo-audit: {r.module.name} on cuda (NVIDIA H200)")


def test_a_saved_what_if_reads_back_as_it_was():
  import json  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.json_report import report_from_dict  # pylint: disable=import-outside-toplevel
  r = rep()
  (f,) = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  # Every field apart from its neighbours, so that a field read as another shows.
  replay = dataclasses.replace(
      r.what_if(fuse=[f]), peak_bytes=1000, baseline_peak_bytes=2000, peak_time=3,
      timeline=(10, 1000, 20), baseline_timeline=(30, 2000, 40),
      baseline_step_time=5e-6, step_time=4e-6)
  with_replay = dataclasses.replace(r, what_if_replay=replay)
  again = report_from_dict(json.loads(with_replay.to_json())).what_if_replay
  assert again == replay


def test_the_time_column_shows_when_any_group_has_a_time():
  from hlo_audit._src.report.grouping import group_findings  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import group_lines  # pylint: disable=import-outside-toplevel
  (f,) = [f for f in rep().findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  assert f.time_saved is not None
  untimed = dataclasses.replace(f, kind=FindingKind.STANDALONE_COPY, boundary="copy.1",
                                time_saved=None)

  def header(findings):
    return group_lines(group_findings(findings), 160, step=1e-3)[0].split()

  assert header([f, untimed])[:3] == ["#", "time", "step"]
  assert "time" not in header([untimed])


def test_a_graph_too_large_keeps_the_kernels_findings_name_then_the_heaviest():
  from hlo_audit._src.report.html import graph_svg  # pylint: disable=import-outside-toplevel
  r = rep()
  (f,) = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  heavy, light = sorted((r.kernel(f.producer), r.kernel(f.consumers[0])),
                        key=lambda k: -k.bytes_moved)
  assert heavy.bytes_moved > light.bytes_moved
  one = graph_svg(r, max_kernels=1)
  assert heavy.name in one and light.name not in one
  # A finding's kernel is kept before a heavier one no finding names.
  unnamed = dataclasses.replace(r, findings=(dataclasses.replace(
      f, producer=light.name, consumers=()),))
  one = graph_svg(unnamed, max_kernels=1)
  assert light.name in one and heavy.name not in one


def _ce_head_report():
  """XLA:GPU's compile of a cross-entropy head for an H200 (committed), on
  the H200's facts: work groups and two capacity groups (donations)."""
  import hlo_audit  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.analysis.time_model_test import fixture  # pylint: disable=import-outside-toplevel
  return hlo_audit.audit_hlo(fixture("ce_head_h200.hlo.gz"),
                             options=hlo_audit.AuditOptions(device="h200"))


def test_the_summary_counts_each_class_and_the_capacity_title_counts_what_it_shows():
  from hlo_audit._src.report.grouping import ranked_groups  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import compact_lines  # pylint: disable=import-outside-toplevel
  r = _ce_head_report()
  act = [g for g in ranked_groups(r.findings) if g.actionable]
  text = " ".join(" ".join(compact_lines(r, 200)).split())
  m = re.search(r"(\d+) findings: (\d+) propose a change \(([^)]*)\) in (\d+) groups", text)
  assert m is not None, text
  classes = dict(reversed(item.split(" ", 1)) for item in m.group(3).split(", "))
  expected: dict[str, int] = {}
  for g in act:
    expected[g.kind.value] = expected.get(g.kind.value, 0) + g.count
  assert {k: int(n) for k, n in classes.items()} == expected
  assert int(m.group(2)) == sum(expected.values()) and int(m.group(4)) == len(act)
  # Both capacity groups shown: no "of 2"; one shown of two: "1 of 2".
  assert "Memory capacity: 2 finding groups, by peak memory saved" in text
  one = " ".join(" ".join(compact_lines(r, 200, top=2)).split())
  assert "Memory capacity: 1 of 2 finding groups" in one


def test_a_buffer_kept_for_reuse_says_so_beside_another_kept_finding():
  from hlo_audit._src.analysis.records import Verdict  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.text import removable  # pylint: disable=import-outside-toplevel
  r = rep()
  (f,) = [f for f in r.findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  b = r.buffer(f.boundary)
  reuse = dataclasses.replace(f, kind=FindingKind.KEEP_REUSE, verdict=Verdict.KEEP)
  fused = dataclasses.replace(f, kind=FindingKind.ALREADY_FUSED, verdict=Verdict.KEEP)
  assert removable(r, b, [fused, reuse]) == ("no", f"keep: read by {b.reuse_count} kernels")
  assert removable(r, b, [fused]) == ("-", "")


def test_the_table_is_ranked_by_time_when_any_shown_group_has_one():
  from hlo_audit._src.report.grouping import group_findings  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import _by  # pylint: disable=import-outside-toplevel
  (f,) = [f for f in rep().findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  untimed = dataclasses.replace(f, kind=FindingKind.STANDALONE_COPY, boundary="copy.1",
                                time_saved=None)
  assert _by("time", group_findings([f, untimed])) == "estimated time"
  assert _by("time", group_findings([untimed])) == "memory traffic"
  assert _by("bytes", group_findings([f])) == "memory traffic"
  assert _by("peak", group_findings([f])) == "peak memory"


def test_a_buffer_of_no_bytes_takes_no_place_in_the_memory_columns():
  from hlo_audit._src.report.memory_view import aggregate_columns  # pylint: disable=import-outside-toplevel
  r = rep()
  last = max(b.live_range[1] for b in r.buffers)
  empty = dataclasses.replace(r.buffers[0], name="empty", bytes=0, live_range=(0, last + 5))
  n = r.module.schedule_length
  columns = aggregate_columns(r.buffers, n, 4)
  assert any(c.largest for c in columns)  # the real buffers are drawn
  assert aggregate_columns((*r.buffers, empty), n, 4) == columns


def test_the_full_findings_table_heads_its_time_column():
  text = rep().to_text(200, all=True).splitlines()
  at = next(i for i, l in enumerate(text) if l.startswith("Findings (fusion decision records)"))
  header = next(l for l in text[at + 1:] if l.strip().startswith("#"))
  assert header.split()[:8] == ["#", "Class", "Boundary", "Shape", "Time", "saved", "Bytes",
                                "saved"], header


def test_the_peak_column_shows_when_any_group_saves_peak():
  from hlo_audit._src.report.grouping import group_findings  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.terminal import group_lines  # pylint: disable=import-outside-toplevel
  (f,) = [f for f in rep().findings if f.kind is FindingKind.UNFUSED_EPILOGUE]
  with_peak = dataclasses.replace(f, peak_saved=4096)
  without = dataclasses.replace(f, kind=FindingKind.STANDALONE_COPY, boundary="copy.1",
                                peak_saved=None)

  def header(findings):
    return group_lines(group_findings(findings), 200)[0]

  assert "peak" in header([with_peak, without]).split()
  assert "peak" not in header([without]).split()
  # The layer column likewise, where any group names its layer.
  layered = dataclasses.replace(f, layer="Dense_0")
  assert "layer" in header([layered, without]).split()
  assert "layer" not in header([without]).split()


def test_a_diff_names_both_modules():
  r = rep()
  other = dataclasses.replace(r, module=dataclasses.replace(r.module, name="jit_other"))
  d = r.diff(other)
  assert (d.before, d.after) == (r.module.name, "jit_other")


def test_the_memory_view_outlines_every_band_live_at_the_peak():
  from hlo_audit._src.report.html import memory_svg  # pylint: disable=import-outside-toplevel
  r = rep()
  live = [b for b in r.buffers if not b.internal and b.bytes > 0
          and b.live_range[0] <= r.peak_time <= b.live_range[1]]
  assert any(b.live_range[0] == r.peak_time for b in live)  # one written at the peak
  assert memory_svg(r).count('class="atpeak"') == len(live)


def test_the_summary_counts_the_users_buffers_not_a_kernels_own():
  from hlo_audit._src.report.terminal import compact_lines  # pylint: disable=import-outside-toplevel
  r = rep()

  def written(report):
    m = re.search(r"written to memory between kernels in (\d+) buffers",
                  " ".join(" ".join(compact_lines(report, 200)).split()))
    return int(m.group(1))

  from hlo_audit._src.report.text import is_transient  # pylint: disable=import-outside-toplevel
  b = next(b for b in r.buffers if not b.internal and is_transient(b))
  inner = dataclasses.replace(r, buffers=tuple(
      dataclasses.replace(x, internal=True) if x is b else x for x in r.buffers))
  assert written(inner) == written(r) - 1


def test_the_kernel_tables_time_and_bound_sit_under_their_heads():
  from hlo_audit._src.analysis.time_model import Bound  # pylint: disable=import-outside-toplevel
  text = rep().to_text(250, all=True).splitlines()
  at = next(i for i, l in enumerate(text) if l.startswith("Kernels by estimated time"))
  header, rows = text[at + 1], text[at + 2:at + 4]
  assert header.split()[-3:] == ["Time", "Bound", "Source"], header
  for row in rows:
    *_, number, unit, bound, _source = row.split()
    assert float(number) > 0 and unit in ("ns", "us", "ms", "s"), row
    assert bound in {b.value for b in Bound}, row
    # Each value ends (a number) or starts (a word) under its own head.
    assert row.index(f"{number} {unit}") + len(f"{number} {unit}") == \
        header.index("Time") + len("Time"), (header, row)
    assert row.index(f" {bound} ") + 1 == header.index("Bound"), (header, row)


def test_the_peaks_buffer_list_says_it_is_cut_only_when_it_is(monkeypatch):
  from hlo_audit._src.report import html  # pylint: disable=import-outside-toplevel
  r = rep()
  n = html.memory_svg(r).count('class="atpeak"')
  assert n >= 2
  monkeypatch.setattr(html, "MAX_LIVE_LISTED", n)  # every one listed
  page = html.memory_svg(r)
  assert f"{n} buffers live at the peak (step {r.peak_time})</summary>" in page
  # A table of them under its heads, largest first, each row its buffer's.
  listed = page.split("buffers live at the peak", 1)[1]
  heads = re.findall(r"<th>([^<]*)</th>", listed)
  assert heads == ["Buffer", "Shape", "Bytes", "Lifetime", "Source"], heads
  by_name = {b.name: b for b in r.buffers}
  rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row)
          for row in listed.split("<tbody>", 1)[1].split("</tbody>", 1)[0].split("</tr>")[:-1]]
  assert len(rows) == n
  for name, shape, size, lifetime, _ in rows:
    b = by_name[name]
    assert (shape, size, lifetime) == (b.shape, fmt_bytes(b.bytes), b.lifetime.value)
  assert [by_name[row[0]].bytes for row in rows] == sorted(
      (by_name[row[0]].bytes for row in rows), reverse=True)
  monkeypatch.setattr(html, "MAX_LIVE_LISTED", n - 1)
  assert f"{n} buffers live at the peak (step {r.peak_time}) (the {n - 1} largest)</summary>" \
      in html.memory_svg(r)


def test_an_internal_buffer_takes_no_place_in_the_memory_columns():
  from hlo_audit._src.report.memory_view import aggregate_columns  # pylint: disable=import-outside-toplevel
  r = rep()
  last = max(b.live_range[1] for b in r.buffers)
  scratch = dataclasses.replace(r.buffers[0], name="scratch", internal=True, bytes=1 << 30,
                                live_range=(0, last + 5))
  n = r.module.schedule_length
  assert aggregate_columns((*r.buffers, scratch), n, 4) == aggregate_columns(r.buffers, n, 4)


def test_the_kernel_graph_draws_its_longest_arcs_first():
  # Short arcs drawn last stay on top of the long ones they cross.
  from hlo_audit._src.report.html import graph_svg  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.report.trace_test import transformer  # pylint: disable=import-outside-toplevel
  spans = [abs(float(y2) - float(y1)) for y1, y2 in re.findall(
      r'<path d="M\d+,(\d+) C\S+ \S+ \d+,(\d+)"', graph_svg(transformer()))]
  assert len(set(spans)) >= 3, spans
  assert spans == sorted(spans, reverse=True), spans


def test_an_intermediate_exactly_at_the_fraction_of_peak_is_listed():
  r = rep()
  (b,) = r.intermediates[:1]
  at = dataclasses.replace(r, peak_bytes=4 * b.bytes,
                           options=dataclasses.replace(r.options, intermediate_fraction=0.25))
  assert b in at.intermediates
  smaller = dataclasses.replace(at, buffers=tuple(
      dataclasses.replace(x, bytes=b.bytes - 1) if x is b else x for x in r.buffers))
  assert b.name not in [x.name for x in smaller.intermediates]


def test_the_buffers_live_at_a_step_come_largest_first():
  from hlo_audit._src.report.memory_view import live_at  # pylint: disable=import-outside-toplevel
  r = rep()
  live = live_at(r.buffers, r.peak_time)
  sizes = [b.bytes for b in live]
  assert len(set(sizes)) >= 2 and sizes == sorted(sizes, reverse=True), sizes
  assert {b.name for b in live} == {
      b.name for b in r.buffers if not b.internal and b.bytes > 0
      and b.live_range[0] <= r.peak_time <= b.live_range[1]}


def _work_group(time_saved):
  """What `time_lines` reads of an actionable group that changes the work."""
  return types.SimpleNamespace(actionable=True, capacity=False, time_saved=time_saved)


def test_the_time_line_sums_the_fixes_saving_most():
  from hlo_audit._src.report.terminal import TOP_FIXES, time_lines  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.units import fmt_time  # pylint: disable=import-outside-toplevel
  r = rep()
  groups = [_work_group(t * 1e-7) for t in (3, 7, 1, 6, 2, 5, 4)]
  want = sum(sorted((g.time_saved for g in groups), reverse=True)[:TOP_FIXES])
  assert TOP_FIXES < len(groups)
  line = next(l for l in time_lines(r, groups) if "fixes:" in l)
  assert line.startswith(f"top {TOP_FIXES} fixes: ~{fmt_time(want)} of "), line


def test_the_summary_counts_no_findings_without_empty_brackets():
  from hlo_audit._src.report.text import summary  # pylint: disable=import-outside-toplevel
  line = next(l for l in summary(dataclasses.replace(rep(), findings=())).splitlines()
              if "findings:" in l)
  assert line.startswith("  findings: 0; fusing the gaps"), line
  line = next(l for l in summary(rep()).splitlines() if "findings:" in l)
  assert line.startswith("  findings: 1 (1 unfused epilogue); "), line


def test_the_kernels_by_kind_table_heads_its_columns():
  text = rep().to_text(200, all=True).splitlines()
  at = text.index("Kernels by kind")
  assert text[at + 1].split() == ["Kind", "Count"], text[at + 1]


def test_a_memory_columns_largest_buffers_are_those_live_at_its_step():
  # A buffer written at the column's step is live there: with it, the
  # largest are live_at's first.
  from hlo_audit._src.report.memory_view import aggregate_columns, live_at  # pylint: disable=import-outside-toplevel
  r = rep()
  columns = aggregate_columns(r.buffers, r.module.schedule_length, 64, top=3)
  starting = [c for c in columns if any(b.live_range[0] == c.step for b in c.largest)]
  assert starting, columns
  for c in columns:
    assert [b.name for b in c.largest] == [b.name for b in live_at(r.buffers, c.step)[:3]], c


def test_the_kernel_graph_draws_each_buffer_from_its_producer_to_each_consumer():
  from hlo_audit._src.report.html import _LIFETIME_COLORS, graph_svg  # pylint: disable=import-outside-toplevel
  from hlo_audit import Verdict  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.report.trace_test import transformer  # pylint: disable=import-outside-toplevel
  base = transformer()
  names = {k.name for k in base.kernels}
  drawn = next(b for b in base.buffers if not b.internal and b.producer in names
               and any(c in names and c != b.producer for c in b.consumers))
  # A kernel's own scratch and a buffer its producer reads back draw no arc.
  r = dataclasses.replace(base, buffers=base.buffers + (
      dataclasses.replace(drawn, name="scratch", internal=True),
      dataclasses.replace(drawn, name="again", consumers=(drawn.producer,))))
  want = {(b.name, b.producer, c) for b in base.buffers if not b.internal
          and b.producer in names for c in b.consumers if c in names and c != b.producer}
  arcs = re.findall(r'stroke="(#[0-9a-f]+)" stroke-opacity="([\d.]+)" stroke-width="([\d.]+)">'
                    r'<title>(\S+) \S+ [^:]+: (\S+) -&gt; (\S+) \(', graph_svg(r))
  assert {(b, p, c) for *_, b, p, c in arcs} == want and len(arcs) == len(want)
  removed = {f.boundary for f in r.findings if f.verdict is not Verdict.KEEP}
  by_name = {b.name: b for b in r.buffers}
  assert any(b in removed for *_, b, _, _ in arcs)
  for color, opacity, width, b, _, _ in arcs:
    if b in removed:  # a boundary a finding removes: red, drawn strong
      assert (color, opacity) == ("#cf222e", "0.9"), b
    else:
      assert (color, opacity) == (_LIFETIME_COLORS[by_name[b].lifetime], "0.45"), b
  # Width grows with the buffer's bytes, 4 px for the largest.
  widths = {b: float(w) for _, _, w, b, _, _ in arcs}
  biggest = max(widths, key=lambda b: by_name[b].bytes)
  assert widths[biggest] == 4.0 == max(widths.values())
  small = min(widths, key=lambda b: by_name[b].bytes)
  assert widths[small] < widths[biggest]


def test_a_capped_kernel_graph_keeps_the_named_kernels_then_the_heaviest():
  from hlo_audit._src.report.html import graph_svg  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.report.trace_test import transformer  # pylint: disable=import-outside-toplevel
  r = transformer()
  named = {f.producer for f in r.findings} | {c for f in r.findings for c in f.consumers}
  named &= {k.name for k in r.kernels}
  cap = len(named) + 2
  assert cap < len(r.kernels)
  rest = sorted((k for k in r.kernels if k.name not in named), key=lambda k: -k.bytes_moved)
  assert rest[1].bytes_moved > rest[-1].bytes_moved
  svg = graph_svg(r, max_kernels=cap)
  shown = set(re.findall(r'<text x="\d+" y="[\d.]+" text-anchor="end"><title>(\S+) ', svg))
  assert shown == named | {rest[0].name, rest[1].name}, shown
  assert f"Showing {cap} of {len(r.kernels)} kernels" in svg
  # Labels: in schedule order, each "name  [kind]", a long one cut to 52.
  order = [k.name for k in r.kernels if k.name in shown]
  assert re.findall(r'<title>(\S+) ', svg.split("</path>")[-1])[:len(order)] == order
  for k in r.kernels:
    if k.name in shown:
      label = f"{k.name}  [{k.kind.value}]"
      assert (label if len(label) <= 52 else label[:49] + "...") in svg, label


def test_a_kernels_label_in_the_graph_is_cut_to_52_characters():
  from hlo_audit._src.report.html import graph_svg  # pylint: disable=import-outside-toplevel
  r = rep()
  k = r.kernels[0]
  suffix = f"  [{k.kind.value}]"
  fits, cut = "a" * (52 - len(suffix)), "b" * (53 - len(suffix))
  svg = graph_svg(dataclasses.replace(r, kernels=(
      dataclasses.replace(k, name=fits), dataclasses.replace(k, name=cut))))
  assert f">{fits}{suffix}</text>" in svg
  assert f">{(cut + suffix)[:49]}...</text>" in svg


def test_the_summary_names_a_device_kind_only_where_it_says_more_than_the_platform():
  from hlo_audit._src.report.text import summary  # pylint: disable=import-outside-toplevel
  r = rep()
  assert (r.module.platform, r.module.device_kind) == ("cpu", "cpu")
  assert summary(r).splitlines()[0] == "module jit_mlp on cpu"
  gpu = dataclasses.replace(r, module=dataclasses.replace(r.module, platform="gpu",
                                                          device_kind="NVIDIA H200"))
  assert summary(gpu).splitlines()[0] == "module jit_mlp on gpu (NVIDIA H200)"


def test_an_aggregated_memory_view_draws_each_class_live_in_any_column(monkeypatch):
  from hlo_audit._src.analysis.buffers import Lifetime  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report import html  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.memory_view import aggregate_columns  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.report.trace_test import transformer  # pylint: disable=import-outside-toplevel
  r = transformer()
  monkeypatch.setattr(html, "MAX_BANDS", 1)  # more buffers than bands: columns
  svg = html.memory_svg(r)
  drawn = re.findall(r'<polygon [^>]*><title>([^<]+)</title></polygon>', svg)
  assert drawn and len(drawn) == len(set(drawn))
  kinds = list(Lifetime)
  # The columns the view drew (its width's worth), by class.
  n = int(re.search(r"(\d+) buffers over (\d+) steps", svg).group(2))
  w = int(re.search(r"the (\d+) pixel columns", svg).group(1))
  drawable = [b for b in r.buffers if not b.internal and b.bytes > 0]
  cols = aggregate_columns(drawable, n, w)
  live = {kinds[k].value for c in cols for k, v in enumerate(c.by_lifetime) if v}
  assert set(drawn) == live
  assert any(not all(c.by_lifetime[kinds.index(Lifetime(v))] for c in cols) for v in live)


def test_every_lifetime_class_has_a_colour():
  from hlo_audit._src.analysis.buffers import Lifetime  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.report.html import _LIFETIME_COLORS  # pylint: disable=import-outside-toplevel
  assert set(_LIFETIME_COLORS) == set(Lifetime)
  assert len(set(_LIFETIME_COLORS.values())) == len(Lifetime)  # told apart


def test_no_timed_fix_means_no_top_fixes_line():
  from hlo_audit._src.report.terminal import time_lines  # pylint: disable=import-outside-toplevel
  untimed = [_work_group(None)]
  lines = time_lines(rep(), untimed)
  assert lines and not any("fix" in l for l in lines), lines


def test_a_step_estimated_at_no_time_gets_no_top_fixes_line():
  from hlo_audit._src.report.terminal import time_lines  # pylint: disable=import-outside-toplevel
  r = rep()
  zero = dataclasses.replace(r, timing=dataclasses.replace(r.timing, step_time=0.0))
  timed = [_work_group(1e-6)]
  assert not any("fix" in l for l in time_lines(zero, timed))


def test_the_intermediate_table_heads_its_columns():
  text = rep().to_text(250, all=True).splitlines()
  at = next(i for i, l in enumerate(text) if l.startswith("Intermediate tensors"))
  assert text[at + 1].split() == [
      "Buffer", "Shape", "Dtype", "Bytes", "Producer", "Consumer(s)", "Reuse", "Live",
      "Lifetime", "Removable?", "Strategy", "Source"], text[at + 1]


def test_a_buffer_of_no_bytes_is_not_drawn_in_the_memory_view():
  from hlo_audit._src.report.html import memory_svg  # pylint: disable=import-outside-toplevel
  r = rep()
  last = max(b.live_range[1] for b in r.buffers)
  empty = dataclasses.replace(r.buffers[0], name="empty", bytes=0, live_range=(0, last))
  assert memory_svg(dataclasses.replace(r, buffers=(*r.buffers, empty))) == memory_svg(r)
  assert memory_svg(dataclasses.replace(r, buffers=(empty,))) == \
      '<p class="muted">No buffers.</p>'


@pytest.mark.parametrize("capacity, saved, shown", [
    (True, 0.0, ""),          # a capacity change that costs no time says none
    (True, -2e-6, "-2.00 us"),  # one that costs time says so
    (False, 0.0, "0 s"),
])
def test_a_groups_time_cell(capacity, saved, shown):
  from hlo_audit._src.report.terminal import group_cells  # pylint: disable=import-outside-toplevel
  (f,) = rep().findings
  g = types.SimpleNamespace(peak_saved=None, time_saved=saved, capacity=capacity,
                            bytes_saved=1024, kind=f.kind, count=1, boundary_shape="f32[8]",
                            kernel="", verdict=f.verdict, source=None, layer="")
  cells = group_cells(g, step=1e-5)
  assert cells["time"] == shown, cells
  assert cells["share"] == ("" if not shown else f"{100 * saved / 1e-5:.1f}%"), cells


def test_a_hint_exactly_as_wide_as_the_width_stays_on_one_line():
  from hlo_audit._src.report.terminal import _aligned  # pylint: disable=import-outside-toplevel
  hints = [("hlo-audit run f.py", "audits it"), ("x", "the shorter one")]
  lines = _aligned(hints, 200)
  assert lines == ["  hlo-audit run f.py  audits it", "  x                   the shorter one"]
  assert _aligned(hints, len(lines[1])) == lines
  narrower = _aligned(hints, len(lines[1]) - 1)
  assert narrower[0] == lines[0] and len(narrower) > 2


def test_the_memory_views_live_bytes_line_has_a_point_per_step_or_per_stride():
  from hlo_audit._src.report import html  # pylint: disable=import-outside-toplevel
  r = rep()
  peak = max(r.timeline)

  def points(timeline):
    page = html.memory_svg(dataclasses.replace(r, timeline=tuple(timeline)))
    line = re.search(r'<polyline points="([^"]*)"', page).group(1)
    return [tuple(map(float, p.split(","))) for p in line.split()]

  # Fewer steps than the view has pixels: a point each, left to right,
  # highest (least y) where the live bytes are most.
  short = [peak // 4, peak, peak // 2, peak // 8, peak // 3]
  pts = points(short)
  assert len(pts) == len(short) and [x for x, _ in pts] == sorted(x for x, _ in pts)
  steps = range(len(short))
  assert sorted(steps, key=lambda i: pts[i][1]) == sorted(steps, key=lambda i: -short[i])
  # Many more: a point per stride, at the stride's most (a sawtooth whose
  # every stride holds its peak draws a flat line at the top; the last
  # stride may be one step).
  saw = [peak, peak // 10] * 10000
  long = points(saw)
  assert 1 < len(long) < len(saw) // 2
  assert {y for _, y in long[:-1]} == {pts[1][1]}

"""The terminal report, as plain text laid out for a width.

The default view fits about a screen: a summary, the top finding groups
ranked by what closing them would save (one line each, with the source line),
and a footer saying how much is left out and what to run next. `all=True` adds
every table: kernels, intermediate tensors, every finding group with its
members, and each group's fusion decision record. Names are shortened in the
middle and `file:line` is never broken (see `layout`).
"""

from __future__ import annotations

import os
import sys

from hlo_audit._src.report import layout, text
from hlo_audit._src.report.grouping import FindingGroup, ranked_groups
from hlo_audit._src.report.layout import Column
from hlo_audit._src.report import units
from hlo_audit._src.report.units import fmt_bytes, fmt_source

#: Finding groups the default view lists.
TOP = 20

#: What to do next, from Python (the CLI passes its own commands); the
#: report's kernel libraries add their swap (`python_hints`).
PYTHON_HINTS = (
    ("print(report.to_text(all=True))", "every kernel, buffer and decision record"),
    ("report.to_html('audit.html')", "grouped findings and the memory view, in a browser"),
    ("report.to_json()", "the whole report, machine-readable"),
)


def python_hints(report) -> tuple[tuple[str, str], ...]:
  """`PYTHON_HINTS` plus a swap hint per kernel library the report's
  findings name (or the audit consulted)."""
  libs = dict.fromkeys(report.kernel_libraries)
  libs.update(dict.fromkeys(f.kernel.split(".", 1)[0] for f in report.findings
                            if f.kernel and "." in f.kernel))
  return PYTHON_HINTS + tuple(
      (f"{lib}.swap(fn)", f"swap the kernels in; {lib}.verify checks the gap closed")
      for lib in libs)


def group_cells(g: FindingGroup) -> dict[str, str]:
  """A group's cells, by column: what every one-line view shows."""
  peak = g.peak_saved
  return {"saves": fmt_bytes(g.bytes_saved), "peak": fmt_bytes(peak) if peak else "",
          "class": g.kind.value, "count": f"x{g.count}" if g.count > 1 else "",
          "shape": g.boundary_shape,
          "kernel": units.short_kernel(g.kernel),
          "verdict": g.verdict.value, "source": fmt_source(g.source) or "?"}


def group_lines(groups, width: int, *, number_from: int = 1, title: str | None = None,
                indent: int = 2) -> list[str]:
  """One line per group (the source under it when the width is too small)."""
  with_peak = any(g.peak_saved is not None for g in groups)
  cols = [Column("#", "num"), Column("saves", "num")]
  keys = ["#", "saves"]
  if with_peak:
    cols.append(Column("peak", "num"))
    keys.append("peak")
  cols += [Column("class", "text", min_width=9), Column("", "num"),
           Column("shape", "name", min_width=10), Column("kernel", "name", optional=True),
           Column("source", "source")]
  keys += ["class", "count", "shape", "kernel", "source"]
  rows = []
  for i, g in enumerate(groups, number_from):
    c = group_cells(g)
    c["#"] = str(i)
    rows.append([c[k] for k in keys])
  return layout.table(cols, rows, width, indent=indent, title=title)


def compact_summary(report, groups, width: int) -> list[str]:
  m = report.module
  kinds = ", ".join(f"{n} {kind}" for kind, n in report.kernels_by_kind().items())
  written = [b for b in report.buffers if not b.internal and text.is_transient(b)]
  act = [g for g in groups if g.actionable]
  n_act = sum(g.count for g in act)
  by_class: dict[str, int] = {}
  for g in act:
    by_class[g.kind.value] = by_class.get(g.kind.value, 0) + g.count
  keep = len(report.findings) - n_act
  where = (f" on {m.platform}" if m.platform else "") + (
      f" ({m.device_kind})" if m.device_kind and m.device_kind != m.platform else "")
  items = [
      f"hlo-audit: {m.name}{where}",
      *text.target_lines(report),
      f"{m.instruction_count} instructions, {len(report.kernels)} kernels ({kinds})",
      text.peak_line(report),
      f"{fmt_bytes(report.materialized_bytes)} written to memory between kernels in "
      f"{len(written)} buffers; {len(report.intermediates)} intermediates >= "
      f"{100 * report.options.intermediate_fraction:g}% of peak",
      f"{len(report.findings)} findings: {n_act} propose a change"
      + (" (" + ", ".join(f"{n} {k}" for k, n in by_class.items()) + ")" if by_class else "")
      + f" in {len(act)} groups; {keep} keep (reuse, already fused)",
  ]
  if n_act:
    items.append(f"closing every gap would save {fmt_bytes(report.bytes_saved)} "
                 "of memory traffic per run")
  items += [f"note: {n}" for n in report.notes]
  out = layout.hang(items[0], width)
  for item in items[1:]:
    out += layout.hang(item, width, "  ", "      ")
  return out


def compact_lines(report, width: int, *, top: int = TOP, hints=None) -> list[str]:
  """The default view: summary, top finding groups, what is left, what next
  (`hints`; None: `python_hints`)."""
  hints = python_hints(report) if hints is None else hints
  groups = ranked_groups(report.findings)
  act = [g for g in groups if g.actionable]
  out = compact_summary(report, groups, width)
  out.append("")
  if report.what_if_replay is not None:
    from hlo_audit._src.report.what_if_text import render_what_if
    for line in render_what_if(report.what_if_replay).splitlines():
      out += layout.hang(line, width, "", "    ")
    out.append("")
  if not act:
    out.append("No fusion gaps found: nothing XLA wrote to memory would be removed "
               "by a fusion this audit knows.")
  else:
    shown = act[:top]
    by = "peak memory, then bytes" if any(g.peak_saved for g in shown) else "bytes"
    out += group_lines(shown, width, title=(
        f"Top {len(shown)} of {len(act)} finding groups, by {by} saved per run "
        f"(xN: N alike at one source line)"))
    rest = act[top:]
    out.append("")
    if rest:
      out += layout.wrap(
          f"{len(rest)} more groups ({sum(g.count for g in rest)} findings) would save "
          f"{fmt_bytes(sum(g.bytes_saved for g in rest))} more.", width)
  if hints:
    out += hint_lines(hints, width)
  return out


def hint_lines(hints, width: int) -> list[str]:
  """"Next:" and the commands, descriptions aligned; when a command is too
  long for its line, the shared part is said once and the rest listed."""
  cmds = [c for c, _ in hints]
  if any(len(c) + len(w) + 4 > width for c, w in hints):
    common = os.path.commonprefix(cmds)
    common = common[:common.rfind(" ") + 1] if " " in common else ""
    if common:
      out = layout.hang(f"Next, add to {common.strip()}:", width, "", "    ")
      return out + _aligned([(c[len(common):], w) for c, w in hints], width)
  return ["Next:"] + _aligned(hints, width)


def _aligned(hints, width: int) -> list[str]:
  # Descriptions line up after the commands of up to 40 characters.
  w = max([len(c) for c, _ in hints if len(c) <= 40] or [0])
  out = []
  for cmd, what in hints:
    line = f"  {cmd.ljust(w)}  {what}"
    out += [line] if len(line) <= width else (
        layout.hang(cmd, width, "  ", "      ") + layout.hang(what, width, "      ", "      "))
  return out


def full_lines(report, width: int, *, max_kernels: int | None = None) -> list[str]:
  """Every table: the summary, kernels, intermediate tensors, peak, finding
  groups with their members, and each group's decision record."""
  out = []
  for line in text.summary(report).splitlines():
    out += layout.hang(line.strip(), width, "  ", "      ") if line.startswith(" ") else (
        layout.hang(line, width))
  out.append("")
  out += layout.table((Column("Kind", "text"), Column("Count", "num")),
                      [(k, str(n)) for k, n in report.kernels_by_kind().items()],
                      width, title="Kernels by kind")
  out.append("")
  rows = text.kernel_rows(report, limit=max_kernels)
  more = len(report.kernels) - len(rows)
  out += layout.table(
      (Column("Kernel", "name", min_width=10), Column("Kind", "text"),
       Column("Detail", "name", optional=True), Column("Fused ops", "text", min_width=10),
       Column("Read", "num"), Column("Written", "num"), Column("Runs", "num"),
       Column("Source", "source")), rows, width,
      title=f"Kernels by bytes moved ({len(rows)}" + (f" of {len(report.kernels)})"
                                                     if more > 0 else ")"))
  out.append("")
  inter = text.intermediate_rows(report, short=True)
  out += layout.table(
      (Column("Buffer", "name", min_width=10), Column("Shape", "name", min_width=9),
       Column("Dtype", "text", optional=True), Column("Bytes", "num"),
       Column("Producer", "name", optional=True),
       Column("Consumer(s)", "text", optional=True), Column("Reuse", "num", optional=True),
       Column("Live", "num", optional=True), Column("Lifetime", "text", min_width=6),
       Column("Removable?", "text", min_width=5), Column("Strategy", "text", min_width=8),
       Column("Source", "source")),
      inter, width,
      title=f"Intermediate tensors (>= {100 * report.options.intermediate_fraction:g}% "
            f"of peak {fmt_bytes(report.peak_bytes)})")
  out.append("")
  out += layout.wrap("Peak memory: " + text.peak_line(report), width, indent="  ")
  out.append("")
  if report.what_if_replay is not None:
    from hlo_audit._src.report.what_if_text import render_what_if
    out += render_what_if(report.what_if_replay).splitlines()
    out.append("")
  if not report.findings:
    out.append("Findings: none")
    return out
  groups = ranked_groups(report.findings)
  out += layout.table(
      (Column("#", "num"), Column("Class", "text", min_width=9),
       Column("Boundary", "name", min_width=10), Column("Shape", "name", min_width=10),
       Column("Bytes saved", "num"), Column("Launches", "num", optional=True),
       Column("Kernel", "name", optional=True), Column("Verdict", "text", min_width=4),
       Column("Source", "source")),
      text.group_rows(groups), width,
      title=f"Findings (fusion decision records): {len(report.findings)} in "
            f"{len(groups)} groups")
  for i, g in enumerate(groups, 1):
    if not g.actionable:
      continue
    out.append("")
    out += layout.hang(f"{i}. " + text.group_sentence(g), width, "", "   ")
    for k, v in text.record_fields(g.first):
      out += layout.hang(f"{k}: {v}", width, "    ", "      ")
    if g.count > 1:
      out += layout.hang("members: " + ", ".join(
          f"{f.boundary or f.producer} ({fmt_bytes(f.bytes_saved)})" for f in g.members),
          width, "    ", "      ")
  return out


def render_text(report, width: int | None = None, *, all: bool = False,  # noqa: A002
                top: int = TOP, hints=None) -> str:
  """The terminal report as text; `width` None follows `layout.text_width`."""
  width = layout.text_width(None, width)
  lines = full_lines(report, width) if all else compact_lines(report, width, top=top,
                                                             hints=hints)
  return "\n".join(lines)


def render_terminal(report, console=None, *, all: bool = False,  # noqa: A002
                    top: int = TOP, width: int | None = None, hints=None) -> None:
  """Writes the report to `console`: a rich Console (its width is used), a
  text stream, or stdout when None."""
  if console is not None and hasattr(console, "export_text"):
    body = render_text(report, width or console.width, all=all, top=top, hints=hints)
    console.print(body, markup=False, highlight=False, soft_wrap=True)
    return
  out = console or sys.stdout
  body = render_text(report, layout.text_width(out, width), all=all, top=top, hints=hints)
  out.write(body + "\n")

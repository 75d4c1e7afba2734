"""The terminal report, as plain text laid out for a width.

The default view fits about a screen: a summary, the top finding groups
ranked by what closing them would save (one line each, with the source line),
and a footer saying how much is left out and what to run next. `all=True` adds
every table: kernels, intermediate tensors, every finding group with its
members, and each group's fusion decision record. Names are shortened in the
middle and `file:line` is never broken (see `layout`).

Names, paths and metadata are the input's text: they are made
`safe.printable` where cells and sentences are built (`layout`, `text`), and
every line is checked once more on its way out, so no control character of a
dump reaches the terminal.
"""

from __future__ import annotations

import os
import sys

from hlo_audit._src.report import layout, text
from hlo_audit._src.report.grouping import FindingGroup, ranked_groups, split_capacity
from hlo_audit._src.report.layout import Column
from hlo_audit._src.report import units
from hlo_audit._src.report.safe import printable
from hlo_audit._src.report.units import fmt_bytes, fmt_source, fmt_time

#: Finding groups the default view lists (the capacity section's included):
#: with the summary and the next commands, a screen at 100 columns.
TOP = 15
#: Capacity groups the default view lists at most.
TOP_CAPACITY = 3

#: What to do next, from Python (the CLI passes its own commands); the
#: report's kernel libraries add their swap (`python_hints`).
PYTHON_HINTS = (
    ("print(report.to_text(all=True))", "every kernel, buffer and decision record"),
    ("report.to_html('audit.html')", "grouped findings and the memory view, in a browser"),
    ("report.to_json()", "the whole report, machine-readable"),
)


def python_hints(report) -> tuple[tuple[str, str], ...]:
  """`PYTHON_HINTS` plus a swap hint per kernel library that swaps fixes
  in (the audit's, else those the findings name)."""
  libs = dict.fromkeys(report.kernel_libraries) or dict.fromkeys(
      f.kernel.split(".", 1)[0] for f in report.findings if f.kernel and "." in f.kernel)
  return PYTHON_HINTS + tuple(
      (f"{lib}.swap(fn)", f"swap the kernels in; {lib}.verify checks the gap closed")
      for lib in libs)


def group_cells(g: FindingGroup, step: float | None = None) -> dict[str, str]:
  """A group's cells, by column: what every one-line view shows (`step`:
  the estimated step, for the time's share of it)."""
  peak = g.peak_saved
  t = g.time_saved
  if g.capacity and not t:
    t = None  # a capacity change that costs no time: nothing to say
  share = f"{100 * t / step:.1f}%" if t is not None and step else ""
  return {"time": fmt_time(t) if t is not None else "", "share": share,
          "saves": fmt_bytes(g.bytes_saved), "peak": fmt_bytes(peak) if peak else "",
          "class": g.kind.value, "count": f"x{g.count}" if g.count > 1 else "",
          "shape": g.boundary_shape,
          "kernel": units.short_kernel(g.kernel),
          "verdict": g.verdict.value, "source": fmt_source(g.source) or "?",
          "layer": g.layer}


def group_lines(groups, width: int, *, number_from: int = 1, title: str | None = None,
                indent: int = 2, step: float | None = None) -> list[str]:
  """One line per group (the source under it when the width is too small);
  the estimated time saved and its share of `step` lead where known."""
  with_peak = any(g.peak_saved is not None for g in groups)
  with_time = any(g.time_saved is not None for g in groups)
  cols = [Column("#", "num")]
  keys = ["#"]
  if with_time:
    cols += [Column("time", "num"), Column("step", "num", optional=True)]
    keys += ["time", "share"]
  cols.append(Column("saves", "num"))
  keys.append("saves")
  if with_peak:
    cols.append(Column("peak", "num"))
    keys.append("peak")
  cols += [Column("class", "text", min_width=9), Column("", "num"),
           Column("shape", "name", min_width=10), Column("kernel", "name", optional=True),
           Column("source", "source")]
  keys += ["class", "count", "shape", "kernel", "source"]
  if any(g.layer for g in groups):
    # Where in a library's model the line is: last, so that narrow
    # terminals drop it first.
    cols.append(Column("layer", "name", optional=True, min_width=12))
    keys.append("layer")
  rows = []
  for i, g in enumerate(groups, number_from):
    c = group_cells(g, step)
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
  items += time_lines(report, groups)
  items += [f"note: {n}" for n in report.notes]
  out = layout.hang(items[0], width)
  for item in items[1:]:
    out += layout.hang(item, width, "  ", "      ")
  return out


#: Fixes the header sums up ("top 5 fixes: ...").
TOP_FIXES = 5


def time_lines(report, groups) -> list[str]:
  """The header's estimate: the step on the device and its split, and what
  the top fixes save; [] without an estimate (the notes say why)."""
  t = report.timing
  if t is None:
    return []
  out = [text.time_line(report)]
  cycles = text.cycles_line(report)
  if cycles:
    out.append(cycles)
  work, _ = split_capacity([g for g in groups if g.actionable])
  timed = sorted((g for g in work if g.time_saved), key=lambda g: -g.time_saved)
  top = timed[:TOP_FIXES]
  if top and t.step_time:
    saved = sum(g.time_saved for g in top)
    fixes = "the top fix" if len(top) == 1 else f"top {len(top)} fixes"
    out.append(f"{fixes}: ~{fmt_time(saved)} of {fmt_time(t.step_time)} "
               f"({100 * saved / t.step_time:.1f}%)")
  return out


def compact_lines(report, width: int, *, top: int = TOP, hints=None,
                  sort: str = "time") -> list[str]:
  """The default view: summary, top finding groups (by `sort`: "time",
  "bytes" or "peak"), capacity findings apart, what is left, what next
  (`hints`; None: `python_hints`)."""
  hints = python_hints(report) if hints is None else hints
  groups = ranked_groups(report.findings, sort)
  act = [g for g in groups if g.actionable]
  work, capacity = split_capacity(act) if sort != "peak" else (act, ())
  out = compact_summary(report, groups, width)
  out.append("")
  if report.what_if_replay is not None:
    from hlo_audit._src.report.what_if_text import render_what_if
    for line in render_what_if(report.what_if_replay).splitlines():
      out += layout.hang(line, width, "", "    ")
    out.append("")
  step = report.timing.step_time if report.timing is not None else None
  if not act:
    out.append("No fusion gaps found: nothing XLA wrote to memory would be removed "
               "by a fusion this audit knows.")
  else:
    all_capacity = capacity
    capacity = capacity[:min(TOP_CAPACITY, max(0, top - 1))] if work else capacity[:top]
    shown = work[:max(0, top - len(capacity))]
    if shown:
      out += group_lines(shown, width, step=step, title=(
          f"Top {len(shown)} of {len(work)} finding groups, by {_by(sort, shown)} saved "
          f"per step (xN: N alike at one source line)"))
    listed = {id(g) for g in (*shown, *capacity)}
    rest = [g for g in act if id(g) not in listed]
    if capacity:
      out.append("")
      out += group_lines(capacity, width, number_from=len(shown) + 1, step=step, title=(
          f"Memory capacity: {len(capacity)}"
          + (f" of {len(all_capacity)}" if len(all_capacity) > len(capacity) else "")
          + f" finding group{'s' if len(all_capacity) > 1 else ''}, by peak memory saved"))
    out.append("")
    if rest:
      out += layout.wrap(
          f"{len(rest)} more groups ({sum(g.count for g in rest)} findings) would save "
          f"{fmt_bytes(sum(g.bytes_saved for g in rest))} more"
          + (f" and ~{fmt_time(sum(g.time_saved or 0.0 for g in rest))}"
             if any(g.time_saved for g in rest) else "") + ".", width)
  if hints:
    out += hint_lines(hints, width)
  return _checked(out)


def _checked(lines: list[str]) -> list[str]:
  """`lines` with anything unsafe that skipped the escaping where it was
  built escaped now (one search per line; escaped text passes unchanged)."""
  return [printable(line) for line in lines]


def _by(sort: str, shown) -> str:
  """What the table is ranked by, in words."""
  if sort == "peak":
    return "peak memory"
  if sort == "bytes" or not any(g.time_saved is not None for g in shown):
    return "memory traffic"
  return "estimated time"


def hint_lines(hints, width: int) -> list[str]:
  """"Next:" and the commands, descriptions aligned; when a command is too
  long for its line, the shared part is said once and the rest listed."""
  # A command names the user's file, and its path may hold anything.
  hints = [(printable(c), printable(w)) for c, w in hints]
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


def full_lines(report, width: int, *, max_kernels: int | None = None,
               sort: str = "time") -> list[str]:
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
  # Before the time: the scratch, then the on-chip traffic.
  chip = ((Column("On chip", "num", optional=True, drop_first=1),
           Column("Scratch", "num", optional=True, drop_first=2))
          if text.shows_on_chip(report) else ())
  out += layout.table(
      (Column("Kernel", "name", min_width=10), Column("Kind", "text"),
       Column("Detail", "name", optional=True), Column("Fused ops", "text", min_width=10),
       Column("Read", "num"), Column("Written", "num"), *chip, Column("Runs", "num"),
       Column("Time", "num", optional=True), Column("Bound", "text", optional=True),
       Column("Source", "source")), rows, width,
      title=("Kernels by estimated time" if report.timing is not None else
             "Kernels by bytes moved") + f" ({len(rows)}" + (f" of {len(report.kernels)})"
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
    return _checked(out)
  groups = ranked_groups(report.findings, sort)
  out += layout.table(
      (Column("#", "num"), Column("Class", "text", min_width=9),
       Column("Boundary", "name", min_width=10), Column("Shape", "name", min_width=10),
       Column("Time saved", "num", optional=True),
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
  return _checked(out)


def render_text(report, width: int | None = None, *, all: bool = False,  # noqa: A002
                top: int = TOP, hints=None, sort: str = "time") -> str:
  """The terminal report as text; `width` None follows `layout.text_width`."""
  width = layout.text_width(None, width)
  lines = full_lines(report, width, sort=sort) if all else compact_lines(
      report, width, top=top, hints=hints, sort=sort)
  return "\n".join(lines)


def render_terminal(report, console=None, *, all: bool = False,  # noqa: A002
                    top: int = TOP, width: int | None = None, hints=None,
                    sort: str = "time") -> None:
  """Writes the report to `console`: a rich Console (its width is used), a
  text stream, or stdout when None."""
  if console is not None and hasattr(console, "export_text"):
    from rich.text import Text

    body = render_text(report, width or console.width, all=all, top=top, hints=hints,
                       sort=sort)
    # A Text, not a str: rich reads neither markup (`[bold red]`) nor emoji
    # codes (`:red_heart:`) in it, so names print as written.
    console.print(Text(body), highlight=False, soft_wrap=True)
    return
  out = console or sys.stdout
  body = render_text(report, layout.text_width(out, width), all=all, top=top, hints=hints,
                     sort=sort)
  out.write(body + "\n")

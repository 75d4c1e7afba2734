"""Terminal rendering with rich: summary, kernel table, intermediate-tensor
table, peak, and findings with their fusion decision records."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from hlo_audit._src.analysis.records import FindingKind
from hlo_audit._src.report import text
from hlo_audit._src.report.units import fmt_bytes

_NUMERIC = {"Bytes", "Read", "Written", "Runs", "Reuse", "Bytes saved", "Launches", "#"}


def _table(title: str, columns, rows) -> Table:
  t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
  for c in columns:
    t.add_column(c, justify="right" if c in _NUMERIC else "left",
                 overflow="fold", no_wrap=c in _NUMERIC)
  for r in rows:
    t.add_row(*r)
  return t


def render_terminal(report, console: Console | None = None, *,
                    max_kernels: int = 25, records: int = 5) -> None:
  """Prints the report to `console` (stdout when None)."""
  console = console or Console()
  console.print(Panel(text.summary(report), title="hlo-audit", expand=False))
  by_kind = _table("Kernels by kind", ("Kind", "Count"),
                   [(k, str(n)) for k, n in report.kernels_by_kind().items()])
  by_kind.columns[1].justify = "right"
  console.print(by_kind)
  rows = text.kernel_rows(report, limit=max_kernels)
  more = len(report.kernels) - len(rows)
  console.print(_table(f"Kernels by bytes moved (top {len(rows)}"
                       + (f" of {len(report.kernels)})" if more > 0 else ")"),
                       text.KERNEL_COLUMNS, rows))
  console.print(_table(
      f"Intermediate tensors (>= {100 * report.options.intermediate_fraction:g}% "
      f"of peak {fmt_bytes(report.peak_bytes)})",
      text.INTERMEDIATE_COLUMNS, text.intermediate_rows(report)))
  console.print("[bold]Peak memory[/bold]: " + text.peak_line(report))
  if report.what_if_replay is not None:
    from hlo_audit._src.report.what_if_text import render_what_if
    console.print(render_what_if(report.what_if_replay), markup=False)
  if not report.findings:
    console.print("[bold]Findings[/bold]: none")
    return
  console.print(_table("Findings (fusion decision records)", text.FINDING_COLUMNS,
                       text.finding_rows(report)))
  shown = [f for f in report.findings
           if f.kind not in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED)][:records]
  for i, f in enumerate(shown, 1):
    body = "\n".join(f"[bold]{k}[/bold]: {v}" for k, v in text.record_fields(f))
    console.print(Panel(body, title=f"{i}. {text.finding_sentence(f)}",
                        title_align="left", expand=True))


def render_text(report, width: int = 200) -> str:
  """The terminal report as plain text (what `str(report)` returns)."""
  console = Console(record=True, width=width, file=io.StringIO(),
                    color_system=None, force_terminal=False)
  render_terminal(report, console)
  return console.export_text()

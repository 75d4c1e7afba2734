"""Markdown rendering: summary, tables and fusion decision records.

Every cell and heading that carries the input's text (names, paths,
metadata) goes through `safe.markdown_text`, so it renders as the characters
it holds: no HTML, link, image or emphasis, and no `|` that splits a row.
"""

from __future__ import annotations

from hlo_audit._src.report import text
from hlo_audit._src.report.grouping import ranked_groups
from hlo_audit._src.report.safe import code_fence, code_span, markdown_text
from hlo_audit._src.report.units import fmt_bytes


def table(columns, rows) -> str:
  out = ["| " + " | ".join(markdown_text(c) for c in columns) + " |",
         "|" + "|".join("---:" if c in ("Bytes", "Read", "Written", "Runs", "Reuse",
                                         "Bytes saved", "Launches", "#", "Count")
                        else "---" for c in columns) + "|"]
  for r in rows:
    out.append("| " + " | ".join(markdown_text(c) for c in r) + " |")
  return "\n".join(out)


def render_markdown(report, max_kernels: int = 40) -> str:
  m = report.module
  parts = [f"# hlo-audit: {code_span(m.name)}", "", code_fence(text.summary(report)), ""]
  parts += ["## Kernels by kind", "",
            table(("Kind", "Count"), [(k, str(n)) for k, n in report.kernels_by_kind().items()]),
            ""]
  rows = text.kernel_rows(report, limit=max_kernels)
  parts += [f"## Kernels by bytes moved (top {len(rows)} of {len(report.kernels)})", "",
            table(text.kernel_columns(report), rows), ""]
  parts += [f"## Intermediate tensors (>= {100 * report.options.intermediate_fraction:g}% "
            f"of peak {fmt_bytes(report.peak_bytes)})", "",
            table(text.INTERMEDIATE_COLUMNS, text.intermediate_rows(report)), ""]
  parts += ["## Peak memory", "", markdown_text(text.peak_line(report)), ""]
  parts += ["## Findings", ""]
  if not report.findings:
    parts += ["None.", ""]
  else:
    groups = ranked_groups(report.findings)
    parts += [f"{len(report.findings)} findings in {len(groups)} groups (the same class "
              "and pattern at one source line), largest saving first.", "",
              table(text.FINDING_COLUMNS, text.group_rows(groups)), ""]
    for i, g in enumerate(groups, 1):
      if not g.actionable:
        continue
      parts += [f"### {i}. {markdown_text(text.group_sentence(g))}", ""]
      parts += [f"- **{k}**: {markdown_text(v)}" for k, v in text.record_fields(g.first)]
      if g.count > 1:
        parts.append("- **members**: " + markdown_text(", ".join(
            f"{m.boundary or m.producer} ({fmt_bytes(m.bytes_saved)})" for m in g.members)))
      parts.append("")
  return "\n".join(parts)

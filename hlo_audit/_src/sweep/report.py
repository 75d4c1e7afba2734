"""The sweep report: `report.md` and `report.html` in the out folder, gathering
the sweep's table, its plots (relative links to the PNGs beside them), the
findings by class across points, and the failed points with their errors.

Both are rebuilt from the records on disk (every shard's), so the report of a
job array is whatever has finished; rerun with `--report_only` once all shards
are done.

Parameter values, errors and the command are the user's text: the Markdown
escapes them (`safe.markdown_text`), the HTML with `html.escape`.
"""

from __future__ import annotations

import datetime
import html
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_audit._src.report.html import CSS, SORT_SCRIPT, Raw, table_html
from hlo_audit._src.report.safe import code_span, markdown_text
from hlo_audit._src.report.units import fmt_bytes, fmt_pct, fmt_time
from hlo_audit._src.sweep import plots as plots_lib
from hlo_audit._src.sweep import store as store_lib

#: Metric columns of the report's table (after the parameters).
COLUMNS = ("status", "kernels", "materialized", "peak", "XLA peak", "ours vs XLA",
           "HBM traffic saved", "findings", "top class", "compile s")

#: Columns of the estimated step, shown when any point has one.
TIME_COLUMNS = ("est. step", "bound by")

#: The split of the step, as `bound by` names its parts.
_PARTS = (("memory_time", "memory"), ("compute_time", "compute"),
          ("launch_time", "launch"), ("communication_time", "communication"))


def _e(s) -> str:
  return html.escape(str(s), quote=True)


def _cell(v) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    return f"{v:g}"
  return str(v)


def _estimated(r: Mapping) -> bool:
  """Whether a finished point has an estimated step (records written before
  estimates, and audits of an unknown device, have none)."""
  return r.get("status") == "ok" and (r.get("audit") or {}).get("step_time") is not None


def bound_by(audit: Mapping) -> str:
  """The largest part of the estimated step and its share: "compute 66%"."""
  step = audit.get("step_time")
  parts = [(audit.get(key) or 0.0, name) for key, name in _PARTS]
  value, name = max(parts, key=lambda p: p[0])
  if not step or not value:
    return "-"
  return f"{name} {100 * value / step:.0f}%"


def table(records: Sequence[Mapping], params: Sequence[str], out_dir: str | None = None
          ) -> tuple[list[str], list[list[Any]], dict[tuple[int, int], Any]]:
  """(columns, rows, sort values) of the report's table; a `Raw` link to a
  point's HTML audit when `out_dir` holds one."""
  timed = any(r.get("timing") for r in records)
  validated = any(r.get("validation") for r in records)
  estimated = any(_estimated(r) for r in records)
  columns = ["id", *params, *COLUMNS]
  if estimated:
    columns += TIME_COLUMNS
  if validated:
    columns.append("valid")
  if timed:
    columns += ["kernel ms", "XLA ms", "speedup"]
  rows, sort_values = [], {}
  for i, r in enumerate(records):
    p = r["params"]
    link = r["id"]
    if out_dir and os.path.exists(os.path.join(out_dir, "points", r["id"] + ".html")):
      link = Raw(f'<a href="points/{_e(r["id"])}.html">{_e(r["id"])}</a>')
    row: list[Any] = [link, *(_cell(p.get(n)) for n in params)]
    a = r.get("audit")
    secs = r.get("seconds", {})
    if r.get("status") == "ok" and a:
      by_class = a.get("findings_by_class")
      saved = a.get("bytes_saved_by_class", {})
      top = max(saved, key=saved.get) if saved else (
          max(by_class, key=by_class.get) if by_class else "-")
      base = len(row)
      row += ["ok", a["kernels"], fmt_bytes(a["materialized_bytes"]),
              fmt_bytes(a["peak_bytes"]), fmt_bytes(a["xla_peak_bytes"]),
              fmt_pct(a["peak_agreement"]), fmt_bytes(a["bytes_saved"]),
              f"{a['findings']} ({a['actionable']} actionable)", top,
              f"{secs.get('compile', 0.0):.2f}"]
      for offset, key in ((2, "materialized_bytes"), (3, "peak_bytes"),
                          (4, "xla_peak_bytes"), (6, "bytes_saved")):
        sort_values[(i, base + offset)] = a[key] if a[key] is not None else -1
    else:
      row += ["FAILED"] + ["-"] * (len(COLUMNS) - 1)
    if estimated:
      if _estimated(r):
        sort_values[(i, len(row))] = a["step_time"]
        row += [fmt_time(a["step_time"]), bound_by(a)]
      else:
        row += ["-"] * len(TIME_COLUMNS)
    if validated:
      v = r.get("validation")
      row.append("-" if not v else ("yes" if v["passed"] else "NO"))
    if timed:
      t = r.get("timing")
      row += (["-"] * 3 if not t else
              [f"{t['kernel_ms']:.4f}", f"{t['xla_ms']:.4f}",
               f"{t['speedup']:.2f}x" + (" (interpret)" if t.get("interpret") else "")])
    rows.append(row)
  return columns, rows, sort_values


def class_totals(records: Sequence[Mapping]) -> list[tuple[str, int, int, int]]:
  """(class, points with it, findings in all, most HBM traffic saved at one point)."""
  totals: dict[str, list[int]] = {}
  for r in records:
    a = r.get("audit") or {}
    for cls, n in a.get("findings_by_class", {}).items():
      t = totals.setdefault(cls, [0, 0, 0])
      t[0] += 1
      t[1] += n
      t[2] = max(t[2], a.get("bytes_saved_by_class", {}).get(cls, 0))
  return sorted(((c, *t) for c, t in totals.items()), key=lambda x: (-x[3], -x[2]))


def _md_table(columns, rows) -> list[str]:
  lines = ["| " + " | ".join(markdown_text(c) for c in columns) + " |",
           "|" + "---|" * len(columns)]
  for row in rows:
    lines.append("| " + " | ".join(markdown_text(_plain(c)) for c in row) + " |")
  return lines


def _plain(c) -> str:
  if isinstance(c, Raw):
    return html.unescape(c.split(">", 1)[1].split("<", 1)[0])
  return str(c)


def _summary_lines(target: str, records, missing: int, command: str,
                   fixed: Mapping[str, Any] | None = None) -> list[str]:
  ok = sum(r.get("status") == "ok" for r in records)
  failed = len(records) - ok
  platforms = sorted({r["audit"]["platform"] for r in records
                      if r.get("audit") and r["audit"].get("platform")})
  lines = [f"target: {target}",
           f"points: {len(records)} recorded ({ok} ok, {failed} failed)"
           + (f"; {missing} of the grid not yet run" if missing else ""),
           f"platform: {', '.join(platforms) or 'unknown'}",
           _time_line(records, ok),
           "generated: " + datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%d %H:%M UTC")]
  total = sum(r.get("seconds", {}).get("total", 0.0) for r in records)
  if records:
    lines.append(f"time in points: {total:.1f} s ({total / len(records):.2f} s per point)")
  if fixed:
    lines.append("same at every point: " + " ".join(f"{k}={v}" for k, v in fixed.items()))
  if command:
    lines.append(f"command: {command}")
  return lines


def _time_line(records, ok: int) -> str:
  """Which device the estimated steps are for, and how many points have one."""
  timed = [r for r in records if _estimated(r)]
  if not timed:
    return "estimated step: none (the device was unknown, or the results predate estimates)"
  devices = sorted({str(r["audit"].get("time_device") or "?") for r in timed})
  steps = [r["audit"]["step_time"] for r in timed]
  line = (f"estimated step on {', '.join(devices)}: {fmt_time(min(steps))} to "
          f"{fmt_time(max(steps))}")
  return line + (f" ({len(timed)} of {ok} ok points estimated)" if len(timed) < ok else "")


def render_markdown(target: str, records, params, pngs, missing: int = 0,
                    command: str = "", fixed: Mapping[str, Any] | None = None) -> str:
  """The report as Markdown (images linked relative to the out folder)."""
  lines = [f"# Sweep: {code_span(target)}", ""]
  lines += [f"- {markdown_text(line)}" for line in _summary_lines(
      target, records, missing, command, fixed)]
  lines.append("")
  for png in pngs:
    # Our own file names (bytes.png, ...), beside the report.
    name = os.path.basename(png)
    lines += [f"![{markdown_text(name)}]({name})", ""]
  lines += ["## Points", ""]
  columns, rows, _ = table(records, params)
  lines += _md_table(columns, rows) + [""]
  totals = class_totals(records)
  if totals:
    lines += ["## Findings by class", ""]
    lines += _md_table(("class", "points", "findings", "most HBM traffic saved at a point"),
                       [(c, p, n, fmt_bytes(b)) for c, p, n, b in totals]) + [""]
  failures = [r for r in records if r.get("status") != "ok"]
  if failures:
    lines += ["## Failed points", ""]
    for r in failures:
      label = " ".join(f"{k}={v}" for k, v in r["params"].items())
      lines.append(f"- {code_span(r['id'])} {markdown_text(label)}: "
                   f"{markdown_text(r.get('error'))}")
    lines.append("")
  return "\n".join(lines)


def render_html(target: str, records, params, pngs, out_dir: str | None = None,
                missing: int = 0, command: str = "",
                fixed: Mapping[str, Any] | None = None) -> str:
  """The report as one HTML page (images linked relative to the out folder)."""
  parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>hlo-audit sweep: {_e(target)}</title>",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<style>{CSS}img.plot{{max-width:100%;border:1px solid #d0d7de;"
           "border-radius:6px;margin:6px 6px 6px 0}</style></head><body>",
           f"<h1>hlo-audit sweep: <code>{_e(target)}</code></h1>",
           '<pre class="summary">' + _e("\n".join(
               _summary_lines(target, records, missing, command, fixed))) + "</pre>"]
  if pngs:
    parts.append("<h2>Plots</h2>")
    parts += [f'<img class="plot" src="{_e(os.path.basename(p))}" '
              f'alt="{_e(os.path.basename(p))}">' for p in pngs]
  columns, rows, sort_values = table(records, params, out_dir)
  numeric = set(COLUMNS[1:]) | set(params) | {"est. step", "kernel ms", "XLA ms", "speedup"}
  parts += [f"<h2>Points ({len(records)})</h2>",
            table_html(columns, rows, numeric, sort_values)]
  totals = class_totals(records)
  if totals:
    parts += ["<h2>Findings by class</h2>",
              table_html(("class", "points", "findings", "most HBM traffic saved at a point"),
                         [(c, p, n, fmt_bytes(b)) for c, p, n, b in totals],
                         ("points", "findings", "most HBM traffic saved at a point"),
                         {(i, 3): t[3] for i, t in enumerate(totals)})]
  failures = [r for r in records if r.get("status") != "ok"]
  if failures:
    parts.append(f"<h2>Failed points ({len(failures)})</h2>")
    for r in failures:
      label = " ".join(f"{k}={v}" for k, v in r["params"].items())
      parts.append(f"<details><summary><code>{_e(r['id'])}</code> {_e(label)}: "
                   f"{_e(r.get('error'))}</summary><pre>{_e(r.get('traceback') or '')}"
                   "</pre></details>")
  parts.append(f"<script>{SORT_SCRIPT}</script></body></html>")
  return "\n".join(parts)


def _order(value) -> tuple:
  """Sort key of a parameter value: numbers by value, before anything else."""
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return (0, value, "")
  return (1, 0, str(value))


def write_sweep_outputs(options, plan) -> list[str]:
  """Plots and both reports for the target of `options`, from every record
  in the out folder; returns the files written.

  The table shows the parameters that vary between points (the others are
  named once, in the summary) and is sorted by them.
  """
  records = [r for r in store_lib.load_records(options.out)
             if r.get("target") == options.target]
  names = list(plan.names)
  vary = plots_lib.varying(records, names)
  params = vary or names
  records.sort(key=lambda r: tuple(_order(r["params"].get(n)) for n in params))
  fixed = {n: records[0]["params"].get(n) for n in names if n not in vary} if records else {}
  done = {r["id"] for r in records}
  missing = sum(pt.id not in done for pt in plan.points)
  os.makedirs(options.out, exist_ok=True)
  # Without matplotlib (an optional extra) the results and reports still come.
  pngs = ([] if plots_lib.unavailable_reason() else
          plots_lib.plot_sweep(records, options.out, names, options.plot_x,
                               title=options.target))
  md = os.path.join(options.out, "report.md")
  with open(md, "w", encoding="utf-8") as f:
    f.write(render_markdown(options.target, records, params, pngs, missing,
                            options.command, fixed))
  page = os.path.join(options.out, "report.html")
  with open(page, "w", encoding="utf-8") as f:
    f.write(render_html(options.target, records, params, pngs, options.out, missing,
                        options.command, fixed))
  return [*pngs, md, page]

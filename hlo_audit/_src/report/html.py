"""HTML rendering: one self-contained page (inline CSS, SVG and a few lines of
script; nothing fetched from the network).

Sections: summary; live bytes over the schedule with the peak marked; the
kernel graph (kernels down the page in schedule order, each buffer an arc
from its producer to each consumer, wider for more bytes, red where a finding
would remove it); the kernel table; the intermediate-tensor table; findings
with their fusion decision records and source lines.
"""

from __future__ import annotations

import html
import math

from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.records import FindingKind, Verdict
from hlo_audit._src.report import text
from hlo_audit._src.report.units import fmt_bytes

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
pre.summary{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:12px;overflow:auto}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0} th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even) td{background:#fbfcfd}
details{border:1px solid #d0d7de;border-radius:6px;margin:6px 0;padding:6px 10px} summary{cursor:pointer;font-weight:600}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0} dt{color:#57606a} dd{margin:0}
.safe{color:#1a7f37}.risky{color:#bc4c00}.keep{color:#57606a} .muted{color:#57606a}
svg text{font:11px system-ui,sans-serif} .legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
"""

_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function(th, i){
  th.addEventListener('click', function(){
    var table = th.closest('table'), body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var asc = th.getAttribute('data-asc') !== '1';
    rows.sort(function(a, b){
      var x = a.cells[i].getAttribute('data-v') || a.cells[i].textContent;
      var y = b.cells[i].getAttribute('data-v') || b.cells[i].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function(r){ body.appendChild(r); });
    th.setAttribute('data-asc', asc ? '1' : '0');
  });
});
"""

_LIFETIME_COLORS = {
    Lifetime.TRANSIENT: "#0969da", Lifetime.SAVED_FOR_BACKWARD: "#8250df",
    Lifetime.EXPANDED_BROADCAST: "#bf8700", Lifetime.LAYOUT_CONVERSION: "#cf222e",
    Lifetime.COMMUNICATION: "#1a7f37", Lifetime.WORKSPACE: "#6e7781",
    Lifetime.EXTERNAL_OUTPUT: "#24292f", Lifetime.INPUT: "#afb8c1",
}


def _e(s) -> str:
  return html.escape(str(s), quote=True)


def _table(columns, rows, numeric=(), sort_values=None) -> str:
  out = ['<table class="sortable"><thead><tr>']
  out += [f"<th>{_e(c)}</th>" for c in columns]
  out.append("</tr></thead><tbody>")
  for r_i, r in enumerate(rows):
    out.append("<tr>")
    for c_i, (c, v) in enumerate(zip(columns, r)):
      cls = ' class="n"' if c in numeric else ""
      dv = ""
      if sort_values and (r_i, c_i) in sort_values:
        dv = f' data-v="{sort_values[(r_i, c_i)]}"'
      out.append(f"<td{cls}{dv}>{_e(v)}</td>")
    out.append("</tr>")
  out.append("</tbody></table>")
  return "".join(out)


def timeline_svg(report, width: int = 960, height: int = 220) -> str:
  """Live bytes per schedule step, the peak marked."""
  series = report.timeline
  if not series:
    return '<p class="muted">No schedule.</p>'
  pad_l, pad_b, pad_t = 70, 26, 14
  w, h = width - pad_l - 10, height - pad_b - pad_t
  top = max(series) or 1
  n = len(series)

  def x(i):
    return pad_l + (i / max(1, n - 1)) * w

  def y(v):
    return pad_t + h - (v / top) * h

  points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(series))
  area = f"{pad_l},{pad_t + h} {points} {x(n - 1):.1f},{pad_t + h}"
  peak_i = max(range(n), key=lambda i: series[i])
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'role="img" aria-label="live bytes over the schedule">',
         f'<polygon points="{area}" fill="#0969da" fill-opacity="0.15"/>',
         f'<polyline points="{points}" fill="none" stroke="#0969da" stroke-width="1.5"/>']
  for frac in (0, 0.5, 1):
    yy = y(top * frac)
    out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#d0d7de"/>')
    out.append(f'<text x="{pad_l - 6}" y="{yy + 4:.1f}" text-anchor="end">{_e(fmt_bytes(top * frac))}</text>')
  px, py = x(peak_i), y(series[peak_i])
  out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{pad_t}" y2="{pad_t + h}" stroke="#cf222e" stroke-dasharray="4 3"/>')
  out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#cf222e"/>')
  anchor = "end" if px > pad_l + w * 0.7 else "start"
  dx = -6 if anchor == "end" else 6
  out.append(f'<text x="{px + dx:.1f}" y="{pad_t + 12}" text-anchor="{anchor}" fill="#cf222e">'
             f'peak {_e(fmt_bytes(series[peak_i]))} at step {peak_i}</text>')
  out.append(f'<text x="{pad_l + w / 2:.1f}" y="{height - 6}" text-anchor="middle" class="muted">schedule step (0..{n - 1})</text>')
  out.append("</svg>")
  return "".join(out)


def graph_svg(report, max_kernels: int = 220) -> str:
  """Kernels in schedule order, buffers as arcs from producer to consumers."""
  kernels = list(report.kernels)
  if len(kernels) > max_kernels:
    # Keep the kernels the findings name, then the heaviest ones.
    named = {f.producer for f in report.findings} | {c for f in report.findings
                                                       for c in f.consumers}
    ranked = sorted(kernels, key=lambda k: (k.name not in named, -k.bytes_moved))
    keep = {k.name for k in ranked[:max_kernels]}
    kernels = [k for k in kernels if k.name in keep]
  if not kernels:
    return '<p class="muted">No kernels.</p>'
  row = 16
  label_w = 330
  arc_room = 420
  height = 20 + row * len(kernels)
  ypos = {k.name: 14 + i * row for i, k in enumerate(kernels)}
  boundaries = {f.boundary for f in report.findings if f.verdict is not Verdict.KEEP}
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + arc_room}" height="{height}" '
         'role="img" aria-label="kernel graph">']
  biggest = max((b.bytes for b in report.buffers), default=1) or 1
  arcs = []
  for b in report.buffers:
    if b.internal or b.producer not in ypos:
      continue
    for c in b.consumers:
      if c not in ypos or c == b.producer:
        continue
      y1, y2 = ypos[b.producer], ypos[c]
      span = abs(y2 - y1)
      bulge = min(arc_room - 20, 18 + span * 0.6)
      width = 0.6 + 3.4 * math.log1p(b.bytes) / math.log1p(biggest)
      color = "#cf222e" if b.name in boundaries else _LIFETIME_COLORS.get(b.lifetime, "#0969da")
      opacity = 0.9 if b.name in boundaries else 0.45
      arcs.append((span, f'<path d="M{label_w},{y1} C{label_w + bulge},{y1} {label_w + bulge},{y2} {label_w},{y2}" '
                  f'fill="none" stroke="{color}" stroke-opacity="{opacity}" stroke-width="{width:.2f}">'
                  f'<title>{_e(b.name)} {_e(b.shape)} {_e(fmt_bytes(b.bytes))}: {_e(b.producer)} -&gt; {_e(c)} ({_e(b.lifetime.value)})</title></path>'))
  out += [a for _, a in sorted(arcs, key=lambda t: -t[0])]
  for k in kernels:
    yy = ypos[k.name]
    label = f"{k.name}  [{k.kind.value}]"
    if len(label) > 52:
      label = label[:49] + "..."
    out.append(f'<circle cx="{label_w}" cy="{yy}" r="3.2" fill="#24292f"/>')
    out.append(f'<text x="{label_w - 8}" y="{yy + 4}" text-anchor="end"><title>{_e(k.name)} {_e(k.detail)}</title>{_e(label)}</text>')
  out.append("</svg>")
  legend = ['<p class="legend">']
  legend.append('<span><i class="sw" style="background:#cf222e"></i>boundary a finding removes</span>')
  for lt, color in _LIFETIME_COLORS.items():
    legend.append(f'<span><i class="sw" style="background:{color}"></i>{_e(lt.value)}</span>')
  legend.append("</p>")
  shown = "" if len(kernels) == len(report.kernels) else (
      f'<p class="muted">Showing {len(kernels)} of {len(report.kernels)} kernels '
      "(those the findings name, then the heaviest).</p>")
  return "".join(legend) + shown + "".join(out)


def render_html(report) -> str:
  m = report.module
  parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>hlo-audit: {_e(m.name)}</title>",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<style>{_CSS}</style></head><body>",
           f"<h1>hlo-audit: <code>{_e(m.name)}</code></h1>",
           f'<pre class="summary">{_e(text.summary(report))}</pre>']
  parts += ["<h2>Live bytes over the schedule</h2>", timeline_svg(report),
            f"<p>{_e(text.peak_line(report))}</p>"]
  parts += ["<h2>Kernels and the buffers between them</h2>", graph_svg(report)]
  numeric = ("Bytes", "Read", "Written", "Runs", "Reuse", "Bytes saved", "Launches", "#", "Count")
  parts += ["<h2>Kernels by kind</h2>",
            _table(("Kind", "Count"), [(k, n) for k, n in report.kernels_by_kind().items()],
                   numeric)]
  kernel_rows = text.kernel_rows(report, limit=200)
  parts += [f"<h2>Kernels by bytes moved (top {len(kernel_rows)} of {len(report.kernels)})</h2>",
            _table(text.KERNEL_COLUMNS, kernel_rows, numeric)]
  inter = text.intermediate_rows(report)
  sv = {(i, 3): b.bytes for i, b in enumerate(report.intermediates)}
  parts += [f"<h2>Intermediate tensors (&ge; {100 * report.options.intermediate_fraction:g}% of peak)</h2>",
            _table(text.INTERMEDIATE_COLUMNS, inter, numeric, sv) if inter else
            '<p class="muted">None.</p>']
  parts.append("<h2>Findings</h2>")
  if not report.findings:
    parts.append('<p class="muted">None.</p>')
  else:
    fsv = {(i, 4): f.bytes_saved for i, f in enumerate(report.findings)}
    parts.append(_table(text.FINDING_COLUMNS, text.finding_rows(report), numeric, fsv))
    for i, f in enumerate(report.findings, 1):
      if f.kind in (FindingKind.ALREADY_FUSED,):
        continue
      cls = {"safe": "safe", "risky": "risky", "keep": "keep"}[f.verdict.value]
      parts.append(f'<details><summary>{i}. <span class="{cls}">[{_e(f.verdict.value)}]</span> '
                   f"{_e(text.finding_sentence(f))}</summary><dl>")
      for k, v in text.record_fields(f):
        parts.append(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>")
      parts.append("</dl></details>")
  if report.notes:
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
  parts.append(f"<script>{_SCRIPT}</script></body></html>")
  return "\n".join(parts)

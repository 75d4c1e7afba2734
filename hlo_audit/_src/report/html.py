"""HTML rendering: one self-contained page (inline CSS, SVG and a few lines of
script; nothing fetched from the network).

Sections: summary; live bytes over the schedule with the peak marked (hover
for a step's bytes) and the buffers live at the peak; the kernel graph
(kernels down the page in schedule order, each buffer an arc from its producer
to each consumer, wider for more bytes, red where a finding would remove it);
the kernel table; the intermediate-tensor table; findings with their fusion
decision records and source lines (the line's text when the file is readable
where the page is rendered). Tables sort by a click on a header, byte sizes by
value.
"""

from __future__ import annotations

import html
import json
import linecache
import math

from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.records import FindingKind, Verdict
from hlo_audit._src.report import text
from hlo_audit._src.report.units import fmt_bytes, fmt_source

#: The page style, shared with the sweep report.
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
pre.summary{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:12px;overflow:auto;white-space:pre-wrap}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0} th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even) td{background:#fbfcfd}
details{border:1px solid #d0d7de;border-radius:6px;margin:6px 0;padding:6px 10px} summary{cursor:pointer;font-weight:600}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0} dt{color:#57606a} dd{margin:0}
.safe{color:#1a7f37}.risky{color:#bc4c00}.keep{color:#57606a} .muted{color:#57606a}
svg text{font:11px system-ui,sans-serif} .legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
.tw{overflow-x:auto;max-width:100%} pre.src{background:#f6f8fa;border-radius:4px;padding:4px 8px;margin:4px 0;overflow:auto}
ul.cols{columns:3 260px;font-size:12.5px;margin:6px 0}
"""

#: Sorts a `table.sortable` by the clicked column: by `data-v` where a cell has
#: one, else numbers (byte sizes such as "1.50 MiB" by their value), else text.
SORT_SCRIPT = """
(function(){
  var UNITS = {B: 1, KiB: 1024, MiB: 1048576, GiB: 1073741824, TiB: 1099511627776};
  function key(cell){
    var v = cell.getAttribute('data-v');
    if (v !== null) return parseFloat(v);
    var t = cell.textContent.trim();
    var m = /^(-?[0-9.]+)\\s*(B|KiB|MiB|GiB|TiB)$/.exec(t);
    if (m) return parseFloat(m[1]) * UNITS[m[2]];
    var n = parseFloat(t);
    return (!isNaN(n) && /^[-+]?[0-9.]/.test(t)) ? n : t;
  }
  document.querySelectorAll('table.sortable th').forEach(function(th){
    th.addEventListener('click', function(){
      // The column within its own table (not the index among every header).
      var i = th.cellIndex, table = th.closest('table'), body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var asc = th.getAttribute('data-asc') !== '1';
      rows.sort(function(a, b){
        var x = key(a.cells[i]), y = key(b.cells[i]);
        var c = (typeof x === 'number' && typeof y === 'number') ? x - y
            : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function(r){ body.appendChild(r); });
      th.setAttribute('data-asc', asc ? '1' : '0');
    });
  });
})();
"""

#: Moves a cursor over the live-bytes chart and says the step and bytes under it.
TIMELINE_SCRIPT = """
(function(){
  var svg = document.getElementById('timeline');
  if (!svg) return;
  var data = JSON.parse(svg.getAttribute('data-series'));
  var x0 = +svg.getAttribute('data-x0'), w = +svg.getAttribute('data-w');
  var cursor = document.getElementById('timeline-cursor');
  var label = document.getElementById('timeline-label');
  function fmt(n){
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return i ? n.toFixed(2) + ' ' + u[i] : n + ' B';
  }
  svg.addEventListener('mousemove', function(ev){
    var box = svg.getBoundingClientRect();
    var f = (ev.clientX - box.left - x0) / w;
    var i = Math.max(0, Math.min(data.length - 1, Math.round(f * (data.length - 1))));
    var x = x0 + (data.length > 1 ? i / (data.length - 1) : 0) * w;
    cursor.setAttribute('x1', x); cursor.setAttribute('x2', x);
    cursor.setAttribute('visibility', 'visible');
    label.textContent = 'step ' + i + ': ' + fmt(data[i]) + ' live';
  });
})();
"""

_LIFETIME_COLORS = {
    Lifetime.TRANSIENT: "#0969da", Lifetime.SAVED_FOR_BACKWARD: "#8250df",
    Lifetime.EXPANDED_BROADCAST: "#bf8700", Lifetime.LAYOUT_CONVERSION: "#bf3989",
    Lifetime.COMMUNICATION: "#1a7f37", Lifetime.WORKSPACE: "#6e7781",
    Lifetime.EXTERNAL_OUTPUT: "#24292f", Lifetime.INPUT: "#afb8c1",
}


def _e(s) -> str:
  return html.escape(str(s), quote=True)


class Raw(str):
  """Cell text that is already HTML (a link), so `table_html` keeps it as is."""


def table_html(columns, rows, numeric=(), sort_values=None) -> str:
  """A sortable table; cells are escaped unless they are `Raw`.

  Args:
    columns: header names.
    rows: sequences of cells, one per column.
    numeric: columns to right-align.
    sort_values: (row, column) -> the value to sort that cell by.
  """
  out = ['<div class="tw"><table class="sortable"><thead><tr>']
  out += [f"<th>{_e(c)}</th>" for c in columns]
  out.append("</tr></thead><tbody>")
  for r_i, r in enumerate(rows):
    out.append("<tr>")
    for c_i, (c, v) in enumerate(zip(columns, r)):
      cls = ' class="n"' if c in numeric else ""
      dv = ""
      if sort_values and (r_i, c_i) in sort_values:
        dv = f' data-v="{sort_values[(r_i, c_i)]}"'
      out.append(f"<td{cls}{dv}>{v if isinstance(v, Raw) else _e(v)}</td>")
    out.append("</tr>")
  out.append("</tbody></table></div>")
  return "".join(out)


#: Longest schedule whose per-step values the page carries for hovering.
_HOVER_STEPS = 50_000


def timeline_svg(report, width: int = 960, height: int = 220) -> str:
  """Live bytes per schedule step, the peak marked; hovering shows the step
  and its live bytes."""
  series = report.timeline
  if not series:
    return '<p class="muted">No schedule.</p>'
  pad_l, pad_b, pad_t = 70, 34, 14
  w, h = width - pad_l - 10, height - pad_b - pad_t
  top = max(series) or 1
  n = len(series)

  def x(i):
    return pad_l + (i / max(1, n - 1)) * w

  def y(v):
    return pad_t + h - (v / top) * h

  # Long schedules: one point per pixel column, its maximum (the peak survives).
  step = max(1, n // (2 * w))
  drawn = [(i, max(series[i:i + step])) for i in range(0, n, step)]
  points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in drawn)
  area = f"{pad_l},{pad_t + h} {points} {x(drawn[-1][0]):.1f},{pad_t + h}"
  peak_i = max(range(n), key=lambda i: series[i])
  hover = ""
  if n <= _HOVER_STEPS:
    hover = (f' id="timeline" data-x0="{pad_l}" data-w="{w}" '
             f'data-series="{_e(json.dumps(list(series), separators=(",", ":")))}"')
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"{hover} '
         f'role="img" aria-label="live bytes over the schedule">',
         f'<polygon points="{area}" fill="#0969da" fill-opacity="0.15"/>',
         f'<polyline points="{points}" fill="none" stroke="#0969da" stroke-width="1.5"/>']
  for frac in (0, 0.5, 1):
    yy = y(top * frac)
    out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#d0d7de"/>')
    out.append(f'<text x="{pad_l - 6}" y="{yy + 4:.1f}" text-anchor="end">{_e(fmt_bytes(top * frac))}</text>')
  for frac in (0, 0.25, 0.5, 0.75, 1):
    i = round(frac * (n - 1))
    out.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{pad_t + h}" y2="{pad_t + h + 4}" stroke="#57606a"/>')
    out.append(f'<text x="{x(i):.1f}" y="{pad_t + h + 15}" text-anchor="middle">{i}</text>')
  px, py = x(peak_i), y(series[peak_i])
  out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{pad_t}" y2="{pad_t + h}" stroke="#cf222e" stroke-dasharray="4 3"/>')
  out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#cf222e"/>')
  anchor = "end" if px > pad_l + w * 0.7 else "start"
  dx = -6 if anchor == "end" else 6
  out.append(f'<text x="{px + dx:.1f}" y="{pad_t + 12}" text-anchor="{anchor}" fill="#cf222e">'
             f'peak {_e(fmt_bytes(series[peak_i]))} at step {peak_i}</text>')
  out.append(f'<text x="{pad_l + w / 2:.1f}" y="{height - 4}" text-anchor="middle" class="muted">schedule step</text>')
  if hover:
    out.append(f'<line id="timeline-cursor" x1="{pad_l}" x2="{pad_l}" y1="{pad_t}" y2="{pad_t + h}" '
               'stroke="#57606a" visibility="hidden"/>')
    out.append(f'<text id="timeline-label" x="{pad_l + w}" y="{height - 4}" text-anchor="end">'
               "hover for the live bytes of a step</text>")
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


def what_if_svg(w, width: int = 960, height: int = 200) -> str:
  """A what-if replay's live bytes before (grey) and after (blue), one scale."""
  before, after = w.baseline_timeline, w.timeline
  n = max(len(before), len(after))
  if not n:
    return ""
  pad_l, pad_b, pad_t = 70, 30, 14
  plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
  top = max(max(before, default=0), max(after, default=0)) or 1
  step = max(1, n // (2 * plot_w))

  def line(series, color, label):
    pts = " ".join(
        f"{pad_l + i / max(1, n - 1) * plot_w:.1f},"
        f"{pad_t + plot_h - max(series[i:i + step]) / top * plot_h:.1f}"
        for i in range(0, len(series), step))
    return (f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5">'
            f"<title>{_e(label)}</title></polyline>")

  return "".join([
      f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
      'role="img" aria-label="live bytes before and after the what-if">',
      line(before, "#8c959f", f"before: peak {fmt_bytes(w.baseline_peak_bytes)}"),
      line(after, "#0969da", f"after: peak {fmt_bytes(w.peak_bytes)}"),
      f'<text x="{pad_l - 6}" y="{pad_t + 4}" text-anchor="end">{_e(fmt_bytes(top))}</text>',
      f'<text x="{pad_l}" y="{height - 8}">grey: before, peak {_e(fmt_bytes(w.baseline_peak_bytes))};'
      f' blue: after {_e("; ".join(w.changes))}, peak {_e(fmt_bytes(w.peak_bytes))}</text>',
      "</svg>"])


def render_html(report) -> str:
  """The report as one self-contained HTML page (see the module docstring)."""
  m = report.module
  parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>hlo-audit: {_e(m.name)}</title>",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<style>{CSS}</style></head><body>",
           f"<h1>hlo-audit: <code>{_e(m.name)}</code></h1>",
           f'<pre class="summary">{_e(text.summary(report))}</pre>']
  parts += ["<h2>Live bytes over the schedule</h2>", timeline_svg(report),
            f"<p>{_e(text.peak_line(report))}</p>"]
  if report.what_if_replay is not None:
    parts += ["<h2>What-if</h2>", what_if_svg(report.what_if_replay)]
  if report.live_at_peak:
    parts.append(f"<details><summary>{len(report.live_at_peak)} buffers live at the peak"
                 '</summary><ul class="cols">'
                 + "".join(f"<li><code>{_e(b)}</code></li>" for b in report.live_at_peak)
                 + "</ul></details>")
  parts += ["<h2>Kernels and the buffers between them</h2>", graph_svg(report)]
  numeric = ("Bytes", "Read", "Written", "Runs", "Reuse", "Bytes saved", "Launches", "#", "Count")
  parts += ["<h2>Kernels by kind</h2>",
            table_html(("Kind", "Count"), [(k, n) for k, n in report.kernels_by_kind().items()],
                   numeric)]
  kernel_rows = text.kernel_rows(report, limit=200)
  parts += [f"<h2>Kernels by bytes moved (top {len(kernel_rows)} of {len(report.kernels)})</h2>",
            table_html(text.KERNEL_COLUMNS, kernel_rows, numeric)]
  inter = text.intermediate_rows(report)
  sv = {(i, 3): b.bytes for i, b in enumerate(report.intermediates)}
  parts += [f"<h2>Intermediate tensors (&ge; {100 * report.options.intermediate_fraction:g}% of peak)</h2>",
            table_html(text.INTERMEDIATE_COLUMNS, inter, numeric, sv) if inter else
            '<p class="muted">None.</p>']
  parts.append("<h2>Findings</h2>")
  if not report.findings:
    parts.append('<p class="muted">None.</p>')
  else:
    fsv = {(i, 4): f.bytes_saved for i, f in enumerate(report.findings)}
    parts.append(table_html(text.FINDING_COLUMNS, text.finding_rows(report), numeric, fsv))
    proposals = [(i, f) for i, f in enumerate(report.findings, 1)
                 if f.verdict is not Verdict.KEEP and f.kind is not FindingKind.ALREADY_FUSED]
    kept = [(i, f) for i, f in enumerate(report.findings, 1)
            if f.verdict is Verdict.KEEP and f.kind is not FindingKind.ALREADY_FUSED]
    parts += [_record_html(i, f) for i, f in proposals]
    if kept:
      # Records that propose nothing, folded so the proposals stand out.
      parts.append(f"<details><summary>{len(kept)} records that keep a buffer "
                   "(no change proposed)</summary>"
                   + "".join(_record_html(i, f) for i, f in kept) + "</details>")
  if report.notes:
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
  parts.append(f"<script>{SORT_SCRIPT}{TIMELINE_SCRIPT}</script></body></html>")
  return "\n".join(parts)


def source_line(loc) -> str | None:
  """The text of a finding's source line, when the file is readable here."""
  if loc is None or not loc.file or not loc.line:
    return None
  line = linecache.getline(loc.file, loc.line)
  return line.rstrip() or None


def _record_html(i: int, f) -> str:
  """One finding: its sentence, its source line, and its decision record."""
  cls = {"safe": "safe", "risky": "risky", "keep": "keep"}[f.verdict.value]
  out = [f'<details class="finding"><summary>{i}. <span class="{cls}">[{_e(f.verdict.value)}]'
         f"</span> {_e(text.finding_sentence(f))}</summary>"]
  code = source_line(f.source)
  if code is not None:
    out.append(f'<pre class="src">{_e(fmt_source(f.source))}:  {_e(code.strip())}</pre>')
  out.append("<dl>")
  for k, v in text.record_fields(f):
    out.append(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>")
  out.append("</dl></details>")
  return "".join(out)

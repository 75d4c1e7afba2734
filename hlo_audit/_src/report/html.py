"""HTML rendering: one self-contained page (inline CSS, SVG and a few lines of
script; nothing fetched from the network).

Sections: summary; the estimated timeline on the device (kernels over
estimated time, one row per track, coloured by what bounds each, the kernels
a finding names marked; bars narrower than a pixel merged, hover for what
they hold); live bytes over the schedule with the peak marked (hover
for a step's bytes); the memory view (buffers stacked over the schedule, each
a band from definition to last use coloured by lifetime, hover for name,
shape, bytes and source, the peak and its live buffers marked); the kernel
graph (kernels down the page in schedule order, each buffer an arc from its
producer to each consumer, wider for more bytes, red where a finding would
remove it); the kernel table; the intermediate-tensor table; the finding
groups of the terminal report, filterable by class and sortable by bytes,
each expanding to its members and decision record with the source line's
text (when the file is readable where the page is rendered). Tables sort by
a click on a header, byte sizes by value. Huge modules stay fast: bands,
groups and rows are capped (largest first) and the page says what it left out.
"""

from __future__ import annotations

import dataclasses
import html
import json
import linecache
import math
import re

from hlo_audit._src.analysis.buffers import Lifetime
from hlo_audit._src.analysis.records import Verdict
from hlo_audit._src.report import text
from hlo_audit._src.report.safe import printable
from hlo_audit._src.report.grouping import ranked_groups
from hlo_audit._src.report.memory_view import aggregate_columns, live_at, stack_buffers
from hlo_audit._src.report import trace, units
from hlo_audit._src.report.units import fmt_bytes, fmt_source, fmt_time

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
.toolbar{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;margin:6px 0;font-size:12.5px}
.toolbar button{font:inherit;padding:2px 8px;cursor:pointer}
.grow{display:grid;grid-template-columns:3em minmax(9em,13em) 3.5em minmax(8em,12em) 6.5em 7.5em 5.5em minmax(6em,9em) 4em 1fr;gap:0 8px;align-items:baseline;font-size:12.5px}
.grow span{overflow:hidden;text-overflow:ellipsis;white-space:nowrap} .grow .n{text-align:right;font-variant-numeric:tabular-nums}
.ghead{font-weight:600;color:#57606a;padding:0 10px 0 24px}
details.group{margin:3px 0;padding:3px 10px} details.group>summary{font-weight:400;list-style-position:outside}
details.group>summary .grow{display:inline-grid;width:calc(100% - 16px)}
#mem-tip{font:12px ui-monospace,monospace;min-height:1.5em;color:#1b1f24;margin:4px 0}
#step-timeline rect.wide{stroke:#fff;stroke-width:.6}
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

#: Hovering a band of the memory view names its buffer.
MEMORY_SCRIPT = """
(function(){
  var svg = document.getElementById('memory');
  if (!svg) return;
  var data = JSON.parse(svg.getAttribute('data-bands'));
  var tip = document.getElementById('mem-tip');
  svg.addEventListener('mouseover', function(ev){
    var i = ev.target.getAttribute && ev.target.getAttribute('data-i');
    if (i === null || i === undefined) return;
    tip.textContent = data[+i];
  });
})();
"""

#: Filters the finding groups by class and sorts them by bytes saved.
FINDINGS_SCRIPT = """
(function(){
  var box = document.getElementById('groups');
  if (!box) return;
  var boxes = document.querySelectorAll('input.fclass');
  var shown = document.getElementById('groups-shown');
  function apply(){
    var on = {}, n = 0;
    boxes.forEach(function(c){ on[c.value] = c.checked; });
    box.querySelectorAll('details.group').forEach(function(d){
      var vis = on[d.getAttribute('data-class')];
      d.style.display = vis ? '' : 'none';
      if (vis) n++;
    });
    shown.textContent = n + ' shown';
  }
  boxes.forEach(function(c){ c.addEventListener('change', apply); });
  var btn = document.getElementById('sort-bytes'), desc = false;
  btn.addEventListener('click', function(){
    desc = !desc;
    var items = Array.prototype.slice.call(box.querySelectorAll('details.group'));
    items.sort(function(a, b){
      var x = +a.getAttribute('data-bytes'), y = +b.getAttribute('data-bytes');
      return desc ? y - x : x - y;
    });
    items.forEach(function(d){ box.appendChild(d); });
    btn.textContent = 'bytes saved ' + (desc ? '\\u2193' : '\\u2191');
  });
  apply();
})();
"""

#: A colour for every lifetime class (indexed: a class added without one fails).
_LIFETIME_COLORS = {
    Lifetime.TRANSIENT: "#0969da", Lifetime.SAVED_FOR_BACKWARD: "#8250df",
    Lifetime.EXPANDED_BROADCAST: "#bf8700", Lifetime.LAYOUT_CONVERSION: "#bf3989",
    Lifetime.COMMUNICATION: "#1a7f37", Lifetime.WORKSPACE: "#6e7781",
    Lifetime.EXTERNAL_OUTPUT: "#24292f", Lifetime.INPUT: "#afb8c1",
}


#: What `html.escape(quote=True)` replaces: most cells hold none of it.
_ESCAPED = re.compile("[&<>\"']")


def _e(s) -> str:
  # Control characters and bidirectional overrides from the input shown as
  # escapes (a U+202E would reorder what the reader sees), then HTML-escaped.
  s = printable(s)
  return html.escape(s, quote=True) if _ESCAPED.search(s) else s


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
      color = "#cf222e" if b.name in boundaries else _LIFETIME_COLORS[b.lifetime]
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


#: Intermediate-tensor rows at most.
MAX_INTERMEDIATES = 500
#: Bands the memory view draws at most (the largest buffers).
MAX_BANDS = 2000
#: Finding groups listed at most, and groups that carry full records.
MAX_GROUPS = 2000
MAX_GROUP_RECORDS = 300
#: Members listed per group, and buffers listed as live at the peak.
MAX_MEMBERS = 200
MAX_LIVE_LISTED = 300


def _band_tip(b) -> str:
  src = fmt_source(b.source)
  return (f"{b.name}  {b.shape}  {fmt_bytes(b.bytes)}  {b.lifetime.value}  "
          f"steps {b.live_range[0]}-{b.live_range[1]}" + (f"  {src}" if src else ""))


def memory_svg(report, width: int = 960, height: int = 320) -> str:
  """Buffers stacked over the schedule, XProf-style: each a band from its
  definition to its last use at a first-fit offset, coloured by lifetime;
  the live bytes as a line; the peak marked and its buffers outlined.
  Hovering a band names its buffer. With more buffers than MAX_BANDS the
  view aggregates: per pixel column, the bytes live at its busiest step
  stacked by lifetime class, hover naming the largest buffers there."""
  drawable = [b for b in report.buffers if not b.internal and b.bytes > 0]
  if not drawable:
    return '<p class="muted">No buffers.</p>'
  pad_l, pad_b, pad_t = 70, 34, 18
  w, h = width - pad_l - 10, height - pad_b - pad_t
  n = max(len(report.timeline), 1 + max(b.live_range[1] for b in drawable))
  peak_t = report.peak_time
  aggregate = len(drawable) > MAX_BANDS
  if aggregate:
    cols = aggregate_columns(drawable, n, w)
    top = max([sum(c.by_lifetime) for c in cols] + [max(report.timeline, default=0)]) or 1
  else:
    lay = stack_buffers(drawable, MAX_BANDS)
    top = max(lay.height, max(report.timeline, default=0)) or 1

  def x(i):
    return pad_l + (i / n) * w

  def y(v):
    return pad_t + h - (v / top) * h

  tips, marks = [], []
  if aggregate:
    kinds = list(Lifetime)
    base = [0] * len(cols)
    for k, lt in enumerate(kinds):
      if not any(c.by_lifetime[k] for c in cols):
        continue
      upper, lower = [], []
      for j, c in enumerate(cols):
        x0, x1 = pad_l + j * w / len(cols), pad_l + (j + 1) * w / len(cols)
        lo, hi = base[j], base[j] + c.by_lifetime[k]
        upper += [f"{x0:.1f},{y(hi):.1f}", f"{x1:.1f},{y(hi):.1f}"]
        lower += [f"{x1:.1f},{y(lo):.1f}", f"{x0:.1f},{y(lo):.1f}"]
        base[j] = hi
      marks.append(f'<polygon points="{" ".join(upper + lower[::-1])}" '
                   f'fill="{_LIFETIME_COLORS[lt]}" fill-opacity="0.75" '
                   f'pointer-events="none"><title>{_e(lt.value)}</title></polygon>')
    for j, c in enumerate(cols):
      x0 = pad_l + j * w / len(cols)
      parts = ", ".join(f"{kinds[k].value} {fmt_bytes(v)}" for k, v in enumerate(c.by_lifetime) if v)
      tips.append(f"step {c.step}: {fmt_bytes(sum(c.by_lifetime))} live ({parts}); largest: "
                  + "; ".join(_band_tip(b) for b in c.largest))
      marks.append(f'<rect x="{x0:.1f}" y="{pad_t}" width="{w / len(cols):.2f}" height="{h}" '
                   f'fill="transparent" data-i="{j}"/>')
  else:
    for i, band in enumerate(lay.bands):
      b = band.buffer
      s0, s1 = b.live_range
      x0, x1 = x(s0), x(s1 + 1)
      y1, y0 = y(band.offset + b.bytes), y(band.offset)
      at_peak = s0 <= peak_t <= s1
      stroke = ' class="atpeak" stroke="#cf222e" stroke-width="0.8"' if at_peak else ""
      marks.append(f'<rect x="{x0:.1f}" y="{y1:.1f}" width="{max(0.6, x1 - x0):.1f}" '
                   f'height="{max(0.6, y0 - y1):.1f}" '
                   f'fill="{_LIFETIME_COLORS[b.lifetime]}" fill-opacity="0.75"'
                   f'{stroke} data-i="{i}"/>')
      tips.append(_band_tip(b))
  out = ['<div id="mem-tip">hover the view for the buffers there</div>',
         f'<svg xmlns="http://www.w3.org/2000/svg" id="memory" width="{width}" height="{height}" '
         f'role="img" aria-label="memory view" data-mode="{"columns" if aggregate else "bands"}" '
         f'data-bands="{_e(json.dumps(tips, separators=(",", ":")))}">']
  out += marks
  series = report.timeline
  if series:
    step = max(1, len(series) // (2 * w))
    pts = " ".join(f"{x(i + 0.5):.1f},{y(max(series[i:i + step])):.1f}"
                   for i in range(0, len(series), step))
    out.append(f'<polyline points="{pts}" fill="none" stroke="#24292f" stroke-width="1" '
               'stroke-dasharray="3 2" pointer-events="none"/>')
  for frac in (0, 0.5, 1):
    yy = y(top * frac)
    out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{yy:.1f}" y2="{yy:.1f}" '
               'stroke="#d0d7de" pointer-events="none"/>')
    out.append(f'<text x="{pad_l - 6}" y="{yy + 4:.1f}" text-anchor="end">{_e(fmt_bytes(top * frac))}</text>')
  for frac in (0, 0.25, 0.5, 0.75, 1):
    i = round(frac * (n - 1))
    out.append(f'<text x="{x(i):.1f}" y="{pad_t + h + 15}" text-anchor="middle">{i}</text>')
  live = live_at(drawable, peak_t)
  px = x(peak_t + 0.5)
  out.append(f'<line id="memory-peak" x1="{px:.1f}" x2="{px:.1f}" y1="{pad_t - 4}" y2="{pad_t + h}" '
             'stroke="#cf222e" stroke-dasharray="4 3" pointer-events="none"/>')
  anchor = "end" if px > pad_l + w * 0.7 else "start"
  out.append(f'<text x="{px + (-6 if anchor == "end" else 6):.1f}" y="{pad_t - 6}" '
             f'text-anchor="{anchor}" fill="#cf222e">peak {_e(fmt_bytes(report.peak_bytes))} '
             f'at step {peak_t}: {len(live)} buffers live</text>')
  out.append(f'<text x="{pad_l + w / 2:.1f}" y="{height - 4}" text-anchor="middle">schedule step</text>')
  out.append("</svg>")
  legend = ['<p class="legend">']
  for lt, color in _LIFETIME_COLORS.items():
    legend.append(f'<span><i class="sw" style="background:{color}"></i>{_e(lt.value)}</span>')
  if not aggregate:
    legend.append('<span><i class="sw" style="border:1px solid #cf222e"></i>live at the peak</span>')
  legend.append("<span>- - - live bytes (XLA's accounting)</span></p>")
  note = ""
  if aggregate:
    note = (f'<p class="muted">{len(drawable)} buffers over {n} steps: more than the '
            f"{w} pixel columns can show one by one, so each column stacks the bytes live "
            "at its busiest step by lifetime class; hover for the largest buffers there.</p>")
  rows = [(b.name, b.shape, fmt_bytes(b.bytes), b.lifetime.value, fmt_source(b.source))
          for b in live[:MAX_LIVE_LISTED]]
  more = f" (the {MAX_LIVE_LISTED} largest)" if len(live) > MAX_LIVE_LISTED else ""
  listed = (f"<details><summary>{len(live)} buffers live at the peak (step {peak_t}){more}"
            "</summary>" + table_html(("Buffer", "Shape", "Bytes", "Lifetime", "Source"), rows,
                                      ("Bytes",),
                                      {(i, 2): b.bytes for i, b in enumerate(live[:MAX_LIVE_LISTED])})
            + "</details>")
  return "".join(legend) + note + "".join(out) + listed


#: Bar colours by what bounds a kernel's estimated time: a colour for every
#: Bound value, "compute" and "communication" being the two tracks too.
BOUND_COLORS = {"memory": "#0969da", "compute": "#8250df", "launch": "#8c959f",
                "communication": "#1a7f37"}
#: Bars narrower than this many pixels merge with their neighbours.
MIN_BAR_PX = 1.0
#: Kernels a merged bar's tooltip names, and findings a bar's.
_TIP_KERNELS = 5
_TIP_FINDINGS = 3


def _finding_tip(findings) -> str:
  out = []
  for f in findings[:_TIP_FINDINGS]:
    t = f.time_saved
    saving = ("time not estimated" if t is None else f"costs ~{fmt_time(-t)} per step"
              if t < 0 else f"saves ~{fmt_time(t)} per step")
    out.append(f"{f.kind.value} at {f.boundary or f.producer} ({saving})")
  more = len(findings) - _TIP_FINDINGS
  return "; ".join(out) + (f"; {more} more" if more > 0 else "")


@dataclasses.dataclass(slots=True)
class _Merged:
  """Bars narrower than a pixel gathered into one: where it starts and ends
  (pixels) and what it holds."""

  x0: float
  x1: float
  count: int = 0
  seconds: float = 0.0
  by_bound: dict = dataclasses.field(default_factory=dict)
  by_kernel: dict = dataclasses.field(default_factory=dict)
  #: Kernels in it that findings name, in order (a dict as an ordered set).
  found: dict = dataclasses.field(default_factory=dict)

  def add(self, launch, x1: float, bound: str, named: bool) -> None:
    self.x1 = max(self.x1, x1)
    self.count += launch.count
    self.seconds += launch.duration
    self.by_bound[bound] = self.by_bound.get(bound, 0.0) + launch.duration
    self.by_kernel[launch.kernel] = self.by_kernel.get(launch.kernel, 0.0) + launch.duration
    if named:
      self.found[launch.kernel] = None


def step_timeline_svg(report, width: int = 960) -> str:
  """The estimated step: one row per track (compute; communication, more
  rows where collectives overlap), a bar per kernel launch coloured by its
  bound, kernels a finding names marked above their bar in red, a
  `<title>` on each bar. Bars narrower than MIN_BAR_PX merge into one per
  pixel (coloured by the bound holding most of their time), so the drawing
  stays small for any number of launches."""
  step = report.timing
  laid = trace.rows(step.launches)
  if not laid:
    return '<p class="muted">No kernel runs.</p>'
  found = trace.findings_by_kernel(report)
  span = max([step.step_time] + [l.start + l.duration for r in laid for l in r.launches])
  if not span > 0:
    return '<p class="muted">The estimated step takes no time.</p>'
  pad_l, pad_t, row_h, gap, axis = 110, 14, 24, 12, 34
  w = width - pad_l - 10
  height = pad_t + len(laid) * (row_h + gap) + axis

  def x(t: float) -> float:
    return pad_l + t / span * w

  out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="step-timeline" width="{width}" '
         f'height="{height}" role="img" aria-label="estimated timeline">']
  base = pad_t + len(laid) * (row_h + gap)
  for r_i, row in enumerate(laid):
    y = pad_t + r_i * (row_h + gap)
    out.append(f'<rect x="{pad_l}" y="{y}" width="{w}" height="{row_h}" fill="#f6f8fa"/>')
  for frac in (0, 0.25, 0.5, 0.75, 1):
    xx = x(frac * span)
    out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{pad_t}" y2="{base}" stroke="#d0d7de"/>')
    # The ends' labels inside the chart: a centred one spills over its edge.
    anchor = {0: "start", 1: "end"}.get(frac, "middle")
    out.append(f'<text x="{xx:.1f}" y="{base + 12}" text-anchor="{anchor}">'
               f'{_e(fmt_time(frac * span))}</text>')
  merged_any = False
  for r_i, row in enumerate(laid):
    y = pad_t + r_i * (row_h + gap)
    out.append(f'<text x="{pad_l - 8}" y="{y + row_h / 2 + 4}" text-anchor="end">'
               f'{_e(row.name)}</text>')
    marks: set[int] = set()
    pending: _Merged | None = None
    for l in row.launches:
      x0, x1 = x(l.start), x(l.start + l.duration)
      k = step.kernel(l.kernel)
      bound = k.bound.value if k is not None else row.track
      names = found.get(l.kernel, ())
      if x1 - x0 >= MIN_BAR_PX:
        if pending is not None:
          _merged_bar(out, marks, pending, y, row_h, step, found)
          pending = None
        _bar(out, marks, x0, x1 - x0, y, row_h, bound,
             _bar_tip(step, l.kernel, l.duration, l.count, bound, names), bool(names), l.count)
        continue
      # A narrow bar joins the merged one before it unless that one is a
      # pixel wide already or a gap lies between them.
      if pending is not None and (x0 - pending.x1 > MIN_BAR_PX / 2
                                  or pending.x1 - pending.x0 >= MIN_BAR_PX):
        _merged_bar(out, marks, pending, y, row_h, step, found)
        pending = None
      if pending is None:
        pending = _Merged(x0, x0)
        merged_any = True
      pending.add(l, x1, bound, bool(names))
    if pending is not None:
      _merged_bar(out, marks, pending, y, row_h, step, found)
  out.append(f'<text x="{pad_l + w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
             "estimated time from the start of the step</text>")
  out.append("</svg>")
  legend = ['<p class="legend">']
  for bound, color in BOUND_COLORS.items():
    legend.append(f'<span><i class="sw" style="background:{color}"></i>{bound}-bound</span>')
  legend.append('<span><svg width="12" height="10" style="vertical-align:-1px">'
                '<path d="M2,2h8l-4,6z" fill="#cf222e"/></svg> a finding names the kernel</span>')
  if merged_any:
    legend.append("<span>bars narrower than a pixel are merged: hover for what they hold</span>")
  legend.append("</p>")
  return "".join(legend) + "".join(out)


def _merged_bar(out: list[str], marks: set[int], m: _Merged, y: float, h: float, step,
                found) -> None:
  """A merged bar, coloured by the bound holding most of its time; its
  tooltip counts its launches and names its longest kernels (as a kernel's
  own bar where it holds one kernel)."""
  bound = max(m.by_bound, key=m.by_bound.get)
  if len(m.by_kernel) == 1:
    (name,) = m.by_kernel
    tip = _bar_tip(step, name, m.seconds, m.count, bound, found.get(name, ()))
  else:
    top = sorted(m.by_kernel.items(), key=lambda kv: -kv[1])[:_TIP_KERNELS]
    share = ", ".join(f"{b} {100 * v / m.seconds:.0f}%" for b, v in sorted(
        m.by_bound.items(), key=lambda kv: -kv[1])) if m.seconds else bound
    tip = (f"{m.count} launches of {len(m.by_kernel)} kernels in {fmt_time(m.seconds)} "
           f"({share}); longest: " + ", ".join(f"{k} {fmt_time(v)}" for k, v in top))
    if m.found:
      more = len(m.found) - _TIP_KERNELS
      tip += ("; named by findings: " + ", ".join(list(m.found)[:_TIP_KERNELS])
              + (f" and {more} more" if more > 0 else ""))
  _bar(out, marks, m.x0, max(MIN_BAR_PX, m.x1 - m.x0), y, h, bound, tip, bool(m.found),
       m.count)


def _bar_tip(step, name: str, seconds: float, count: int, bound: str, findings) -> str:
  """A kernel's bar: its name, time, bound, bytes per launch, findings."""
  k = step.kernel(name)
  tip = (f"{name}: {fmt_time(seconds)}" + (f" for {count} launches" if count > 1 else "")
         + f", {bound}-bound")
  if k is not None and k.bytes:
    tip += f", {fmt_bytes(k.bytes)} per launch"
  return tip + ("; " + _finding_tip(findings) if findings else "")


def _bar(out: list[str], marks: set[int], x0: float, width: float, y: float, h: float,
         bound: str, tip: str, found: bool, count: int) -> None:
  """One bar, and the marker above it where a finding names its kernel (one
  per pixel column)."""
  # Wide bars get a hairline edge so neighbours of one colour stay apart.
  cls = " ".join(c for c, on in (("found", found), ("wide", width >= 4)) if on)
  cls = f' class="{cls}"' if cls else ""
  out.append(f'<rect x="{x0:.1f}" y="{y}" width="{width:.2f}" height="{h}" '
             f'fill="{BOUND_COLORS[bound]}"{cls} data-n="{count}">'
             f"<title>{_e(tip)}</title></rect>")
  cx = round(x0 + width / 2)
  if found and cx not in marks:
    marks.add(cx)
    out.append(f'<path d="M{cx - 4},{y - 9}h8l-4,6z" fill="#cf222e" class="marker">'
               f"<title>{_e(tip)}</title></path>")


def step_timeline_html(report) -> str:
  """The "Estimated timeline" section's body: the step and its split, the
  timeline, what the model assumed; one sentence when there is no estimate."""
  why = trace.no_timeline_reason(report)
  step = report.timing
  if step is None:
    return f'<p class="muted">No timeline: {_e(why)}.</p>'
  head = text.time_line(report)
  if step.overlapped_communication:
    head += f"; {fmt_time(step.overlapped_communication)} of communication hidden under kernels"
  if why is not None:
    return f'<p>{_e(head)}</p><p class="muted">No timeline: {_e(why)}.</p>'
  launches = sum(l.count for l in step.launches)
  folded = any(l.count > 1 for l in step.launches)
  parts = [f"<p>{_e(head)}</p>",
           f'<p class="muted">{launches:,} launches'
           + (f" in {len(step.launches)} bars (loops folded: one bar per kernel for all its "
              "iterations)" if folded else "")
           + "; <code>report.to_trace(path)</code> writes them for ui.perfetto.dev.</p>",
           step_timeline_svg(report)]
  if step.assumptions:
    parts.append("<details><summary>What the estimate assumes</summary><ul>"
                 + "".join(f"<li>{_e(a)}</li>" for a in step.assumptions) + "</ul></details>")
  return "".join(parts)


def findings_html(report) -> str:
  """Finding groups (as in the terminal: by estimated time saved), filterable
  by class and sortable by bytes saved; each expands to its members and
  decision record."""
  groups = ranked_groups(report.findings)
  if not groups:
    return '<p class="muted">None.</p>'
  counts: dict[str, tuple[str, int]] = {}
  for g in groups:
    name, c = counts.get(g.kind.slug, (g.kind.value, 0))
    counts[g.kind.slug] = (name, c + g.count)
  bar = ['<div class="toolbar"><span>classes:</span>']
  for slug, (name, c) in counts.items():
    bar.append(f'<label><input type="checkbox" class="fclass" value="{_e(slug)}" checked> '
               f"{_e(name)} ({c})</label>")
  bar.append('<button id="sort-bytes" type="button">sort by bytes saved</button>'
             '<span id="groups-shown" class="muted"></span></div>')
  head = ('<div class="grow ghead"><span>#</span><span>class</span><span>count</span>'
          '<span>shape</span><span class="n">time saved</span><span class="n">bytes saved</span>'
          '<span class="n">launches</span>'
          '<span>kernel</span><span>verdict</span><span>source</span></div>')
  out = bar + [head, '<div id="groups">']
  for i, g in enumerate(groups[:MAX_GROUPS], 1):
    out.append(_group_html(i, g, full=i <= MAX_GROUP_RECORDS))
  out.append("</div>")
  if len(groups) > MAX_GROUPS:
    more = len(groups) - MAX_GROUPS
    out.append(f'<p class="muted">{more} more group{"s" if more > 1 else ""} (the smallest) '
               f'{"are" if more > 1 else "is"} in the JSON report.</p>')
  return "".join(out)


def _short_kernel(name: str | None) -> str:
  return units.short_kernel(name)


def _group_html(i: int, g, full: bool) -> str:
  cls = g.verdict.value
  f = g.first
  row = (f'<span>{i}</span><span>{_e(g.kind.value)}</span><span>x{g.count}</span>'
         f'<span title="{_e(g.boundary_shape)}">{_e(g.boundary_shape)}</span>'
         f'<span class="n">{_e(fmt_time(g.time_saved)) if g.time_saved is not None else "-"}</span>'
         f'<span class="n">{_e(fmt_bytes(g.bytes_saved))}</span><span class="n">{g.launches_removed}</span>'
         f'<span title="{_e(g.kernel or "")}">{_e(_short_kernel(g.kernel))}</span><span class="{cls}">{_e(cls)}</span>'
         f'<span title="{_e(" in ".join(filter(None, (fmt_source(g.source), g.layer))))}">'
         f'{_e(fmt_source(g.source) or "?")}</span>')
  out = [f'<details class="group" data-class="{_e(g.kind.slug)}" data-bytes="{g.bytes_saved}">'
         f'<summary><span class="grow">{row}</span></summary>',
         f"<p>{_e(text.group_sentence(g))}</p>"]
  members = g.members[:MAX_MEMBERS]
  rows = [(m.boundary or "-", m.producer or "-", ", ".join(m.consumers[:4]) +
           (f" +{len(m.consumers) - 4}" if len(m.consumers) > 4 else ""),
           fmt_bytes(m.bytes_saved), m.launches_removed, m.layer or "-", m.computation)
          for m in members]
  out.append(table_html(("Boundary", "Producer", "Consumers", "Bytes saved", "Launches",
                         "Layer", "Computation"), rows, ("Bytes saved", "Launches"),
                        {(j, 3): m.bytes_saved for j, m in enumerate(members)}))
  if g.count > MAX_MEMBERS:
    out.append(f'<p class="muted">{g.count - MAX_MEMBERS} more members.</p>')
  if full:
    code = source_line(f.source)
    if code is not None:
      out.append(f'<pre class="src">{_e(fmt_source(f.source))}:  {_e(code.strip())}</pre>')
    out.append("<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>"
                                for k, v in text.record_fields(f)) + "</dl>")
  out.append("</details>")
  return "".join(out)


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
  parts += ["<h2>Estimated timeline</h2>", step_timeline_html(report)]
  parts += ["<h2>Live bytes over the schedule</h2>", timeline_svg(report),
            f"<p>{_e(text.peak_line(report))}</p>"]
  parts += ["<h2>Memory view: buffers over the schedule</h2>", memory_svg(report)]
  if report.what_if_replay is not None:
    parts += ["<h2>What-if</h2>", what_if_svg(report.what_if_replay)]
  parts += ["<h2>Kernels and the buffers between them</h2>", graph_svg(report)]
  numeric = ("Bytes", "Read", "Written", "On chip", "Scratch", "Runs", "Reuse", "Bytes saved", "Launches", "#", "Count")
  parts += ["<h2>Kernels by kind</h2>",
            table_html(("Kind", "Count"), [(k, n) for k, n in report.kernels_by_kind().items()],
                   numeric)]
  kernel_rows = text.kernel_rows(report, limit=200)
  parts += [f"<h2>Kernels by bytes moved (top {len(kernel_rows)} of {len(report.kernels)})</h2>",
            table_html(text.kernel_columns(report), kernel_rows, numeric)]
  inter_all = report.intermediates
  inter = text.intermediate_rows(report, limit=MAX_INTERMEDIATES)
  sv = {(i, 3): b.bytes for i, b in enumerate(inter_all[:MAX_INTERMEDIATES])}
  parts += [f"<h2>Intermediate tensors (&ge; {100 * report.options.intermediate_fraction:g}% of peak)</h2>",
            table_html(text.INTERMEDIATE_COLUMNS, inter, numeric, sv) if inter else
            '<p class="muted">None.</p>']
  if len(inter_all) > MAX_INTERMEDIATES:
    parts.append(f'<p class="muted">The {MAX_INTERMEDIATES} largest of {len(inter_all)}.</p>')
  n_groups = len(ranked_groups(report.findings))
  parts.append(f"<h2>Findings: {len(report.findings)} in {n_groups} groups</h2>")
  parts.append(findings_html(report))
  if report.notes:
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
  parts.append(f"<script>{SORT_SCRIPT}{TIMELINE_SCRIPT}{MEMORY_SCRIPT}{FINDINGS_SCRIPT}"
               "</script></body></html>")
  return "\n".join(parts)


def source_line(loc) -> str | None:
  """The text of a finding's source line, when the file is readable here."""
  if loc is None or not loc.file or not loc.line:
    return None
  line = linecache.getline(loc.file, loc.line)
  return line.rstrip() or None

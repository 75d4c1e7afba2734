"""The HTML report in a real browser: headless Chromium loads the page, which
must render without console errors or network requests, draw its chart, and
respond to its scripts. Skips when Chromium is not installed (Debian:
`apt-get install -y chromium`)."""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import linecache
import pathlib
import re

import numpy as np
import pytest

from headless_chromium import Chromium, find_chromium

import hlo_audit
from hlo_audit._src.examples.transformer import TransformerConfig, example
from hlo_audit._src.report import html
from hlo_audit._src.report.grouping import ranked_groups
from hlo_audit._src.report.units import fmt_bytes, fmt_source

BENCH = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "bench_html.py"

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
Image = pytest.importorskip("PIL.Image", reason="Pillow (with matplotlib) reads screenshots")

UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}


@functools.cache
def report():
  cfg = TransformerConfig(batch=2, seq=32, d_model=64, heads=2, d_ff=128, vocab=128)
  fn, args = example(cfg)
  return hlo_audit.audit(fn, *args)


@pytest.fixture(scope="module")
def browser():
  with Chromium(CHROMIUM, width=1280, height=900) as c:
    yield c


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
  path = tmp_path_factory.mktemp("html") / "report.html"
  report().to_html(str(path))
  url = path.as_uri()
  before = len(browser.events)
  browser.load(url)
  return browser, url, path, before


def _bytes(text: str) -> float:
  m = re.fullmatch(r"(-?[0-9.]+) (B|KiB|MiB|GiB|TiB)", text.strip())
  assert m, text
  return float(m.group(1)) * UNITS[m.group(2)]


def _png(data: bytes):
  return Image.open(io.BytesIO(data)).convert("RGB")


def test_the_page_is_self_contained_and_loads_without_errors(page):
  browser, url, path, before = page
  text = path.read_text()
  assert "<link" not in text and "src=" not in text
  assert set(re.findall(r"https?://[^\s\"']+", text)) <= {"http://www.w3.org/2000/svg"}
  assert browser.errors(since=before) == []
  assert browser.requests(since=before) == [url]


def test_every_section_renders_with_the_report_contents(page):
  browser, *_ = page
  r = report()
  headings = browser.evaluate("Array.from(document.querySelectorAll('h2'), h => h.textContent)")
  for h in ("Estimated timeline", "Live bytes over the schedule", "Memory view", "Kernels and the buffers between them",
            "Kernels by kind", "Intermediate tensors", "Findings"):
    assert any(x.startswith(h) for x in headings), (h, headings)
  rows = browser.evaluate("""(function(){
      function n(h){ var e = Array.from(document.querySelectorAll('h2')).find(x => x.textContent.startsWith(h));
        while (e && !(e.querySelector && e.querySelector('table.sortable'))) e = e.nextElementSibling;
        return e.querySelector('table.sortable').tBodies[0].rows.length; }
      return [n('Kernels by kind'), n('Kernels by bytes'), n('Intermediate tensors')]; })()""")
  assert rows == [len(r.kernels_by_kind()), min(200, len(r.kernels)), len(r.intermediates)]
  graph = browser.evaluate("""(function(){
      var g = document.querySelector('svg[aria-label="kernel graph"]');
      var b = g.getBoundingClientRect();
      return [g.querySelectorAll('circle').length, g.querySelectorAll('path').length,
              b.width, b.height]; })()""")
  assert graph[0] == len(r.kernels) and graph[1] > len(r.kernels) / 2
  assert graph[2] > 400 and graph[3] > 10 * len(r.kernels)
  # Finding groups carry their source line's text.
  first = next(f for f in r.actionable if f.source is not None)
  code = linecache.getline(first.source.file, first.source.line).strip()
  sources = browser.evaluate("Array.from(document.querySelectorAll('pre.src'), p => p.textContent)")
  assert any(s.endswith(code) for s in sources) and code
  peak = browser.evaluate("""Array.from(document.querySelectorAll('#timeline text'),
                             t => t.textContent).filter(t => t.startsWith('peak'))[0]""")
  assert peak == f"peak {fmt_bytes(max(r.timeline))} at step {r.timeline.index(max(r.timeline))}"


def test_screenshot_is_not_blank_and_the_chart_has_drawn_pixels(page):
  browser, *_ = page
  shot = _png(browser.screenshot())
  gray = shot.convert("L").histogram()
  assert 1 - sum(gray[250:]) / (shot.width * shot.height) > 0.05
  assert len(shot.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20
  x, y, w, h = browser.evaluate("""(function(){
      var b = document.getElementById('timeline').getBoundingClientRect();
      return [b.left + window.scrollX, b.top + window.scrollY, b.width, b.height]; })()""")
  assert w > 500 and h > 150
  chart = _png(browser.screenshot(clip={"x": x, "y": y, "width": w, "height": h}))
  px = [chart.getpixel((i, j)) for j in range(chart.height) for i in range(chart.width)]
  blue = sum(1 for r, g, b in px if b > 150 and b - r > 20)    # the series and its fill
  red = sum(1 for r, g, b in px if r > 150 and r - b > 80 and r - g > 80)  # the peak marker
  ink = sum(1 for r, g, b in px if min(r, g, b) < 235)
  assert blue / len(px) > 0.05 and red > 20 and ink / len(px) > 0.1


def test_hovering_the_chart_names_a_step_and_headers_sort_tables(page):
  browser, *_ = page
  x, y, w, h = browser.evaluate("""(function(){
      var b = document.getElementById('timeline').getBoundingClientRect();
      return [b.left, b.top, b.width, b.height]; })()""")
  browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=x + w / 2, y=y + h / 2)
  label = browser.evaluate("document.getElementById('timeline-label').textContent")
  m = re.fullmatch(r"step (\d+): (.+) live", label)
  assert m, label
  step = int(m.group(1))
  assert 0 < step < len(report().timeline) - 1
  assert m.group(2) == fmt_bytes(report().timeline[step])

  # The kernel table's "Read" column holds sizes like "4 B" and "1.50 MiB".
  col = browser.evaluate("""(function(){
      var h = Array.from(document.querySelectorAll('h2')).find(x => x.textContent.startsWith('Kernels by bytes'));
      var t = h.nextElementSibling.querySelector('table.sortable');
      var i = Array.from(t.tHead.rows[0].cells).findIndex(c => c.textContent === 'Read');
      t.tHead.rows[0].cells[i].click();
      return Array.from(t.tBodies[0].rows, r => r.cells[i].textContent); })()""")
  values = [_bytes(v) for v in col]
  assert values == sorted(values) and values[0] < values[-1]
  assert browser.errors() == []


def test_the_estimated_timeline_draws_its_bars_coloured_by_bound(page):
  browser, *_ = page
  r = report()
  count, launches, thin, box, tips = browser.evaluate("""(function(){
      var s = document.getElementById('step-timeline');
      s.scrollIntoView({block: 'center'});
      var bars = Array.from(s.querySelectorAll('rect[data-n]'));
      var b = s.getBoundingClientRect();
      return [bars.length, bars.reduce((a, e) => a + +e.getAttribute('data-n'), 0),
              bars.filter(e => e.getBBox().width < 0.99 || e.getBBox().height < 10).length,
              [b.left + window.scrollX, b.top + window.scrollY, b.width, b.height],
              Array.from(s.querySelectorAll('rect.found > title'), t => t.textContent)]; })()""")
  assert launches == sum(l.count for l in r.timing.launches) and count > 10 and thin == 0
  classes = {f.kind.value for f in r.actionable}
  assert tips and all(any(c in t for c in classes) for t in tips)
  x, y, w, h = box
  assert w > 500 and h > 40
  px = np.asarray(_png(browser.screenshot(clip={"x": x, "y": y, "width": w, "height": h})))
  px = px.astype(int)
  # Each bound holding a quarter of the step shows in its colour (thin bars
  # merge into pixels coloured by their majority: a bound of many small
  # launches shows less than its share).
  share: dict[str, float] = {}
  for l in r.timing.launches:
    bound = r.timing.kernel(l.kernel).bound.value
    share[bound] = share.get(bound, 0.0) + l.duration / r.timing.step_time
  for bound, color in html.BOUND_COLORS.items():
    rgb = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
    seen = (np.abs(px - rgb).sum(axis=2) < 40).mean()
    if share.get(bound, 0.0) > 0.25:
      assert seen > 0.02, (bound, share, seen)
  red = ((px[..., 0] > 150) & (px[..., 0] - px[..., 2] > 80) & (px[..., 0] - px[..., 1] > 80))
  assert red.sum() > 20   # the finding markers
  assert browser.errors() == []


def test_memory_view_stacks_every_buffer_and_names_it_on_hover(page):
  browser, *_ = page
  r = report()
  drawn = [b for b in r.buffers if not b.internal and b.bytes > 0]
  at_peak = [b for b in drawn if b.live_range[0] <= r.peak_time <= b.live_range[1]]
  mode, bands, outlined = browser.evaluate("""(function(){
      var s = document.getElementById('memory');
      return [s.getAttribute('data-mode'), s.querySelectorAll('rect[data-i]').length,
              s.querySelectorAll('rect.atpeak').length]; })()""")
  assert (mode, bands, outlined) == ("bands", len(drawn), len(at_peak))
  label = browser.evaluate("""Array.from(document.querySelectorAll('#memory text'),
                              t => t.textContent).filter(t => t.startsWith('peak'))[0]""")
  assert label == f"peak {fmt_bytes(r.peak_bytes)} at step {r.peak_time}: {len(at_peak)} buffers live"
  # Bands live at one step never overlap (a band is at least 0.6 px tall).
  boxes = browser.evaluate("""Array.from(document.querySelectorAll('#memory rect.atpeak'), e => {
      var b = e.getBBox(); return [b.y, b.y + b.height]; })""")
  boxes.sort()
  assert all(a[1] <= b[0] + 0.65 for a, b in zip(boxes, boxes[1:]))
  # Hover the largest band: the tip names its buffer, shape, bytes and source.
  big = max(drawn, key=lambda b: b.bytes)
  i = browser.evaluate(f"JSON.parse(document.getElementById('memory').getAttribute('data-bands'))"
                       f".findIndex(t => t.startsWith({json.dumps(big.name + '  ')}))")
  x, y = browser.evaluate(f"""(function(){{
      var e = document.querySelector('#memory rect[data-i="{i}"]');
      e.scrollIntoView({{block: 'center'}});
      var b = e.getBoundingClientRect();
      return [b.left + b.width / 2, b.top + b.height / 2]; }})()""")
  browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
  tip = browser.evaluate("document.getElementById('mem-tip').textContent")
  assert tip.startswith(f"{big.name}  {big.shape}  {fmt_bytes(big.bytes)}  {big.lifetime.value}")
  assert fmt_source(big.source) in tip
  # The picture has coloured bands.
  x, y, w, h = browser.evaluate("""(function(){
      var b = document.getElementById('memory').getBoundingClientRect();
      return [b.left + window.scrollX, b.top + window.scrollY, b.width, b.height]; })()""")
  shot = _png(browser.screenshot(clip={"x": x, "y": y, "width": w, "height": h}))
  px = np.asarray(shot).astype(int)
  colored = (px.max(axis=2) - px.min(axis=2) > 60).mean()
  assert colored > 0.1


def test_finding_groups_filter_by_class_sort_by_bytes_and_expand(page):
  browser, *_ = page
  r = report()
  groups = ranked_groups(r.findings)
  state = browser.evaluate("""Array.from(document.querySelectorAll('#groups details.group'),
      d => [d.getAttribute('data-class'), +d.getAttribute('data-bytes'), d.style.display])""")
  assert [(c, b) for c, b, _ in state] == [(g.kind.slug, g.bytes_saved) for g in groups]
  slug = "unfused-epilogue"
  n = sum(1 for g in groups if g.kind.slug == slug)
  shown = browser.evaluate(f"""(function(){{
      var c = document.querySelector('input.fclass[value="{slug}"]');
      c.click();
      var vis = Array.from(document.querySelectorAll('#groups details.group'))
          .filter(d => d.style.display !== 'none');
      var out = [vis.length, vis.some(d => d.getAttribute('data-class') === '{slug}'),
                 document.getElementById('groups-shown').textContent];
      c.click();
      return out; }})()""")
  assert shown == [len(groups) - n, False, f"{len(groups) - n} shown"]
  order = browser.evaluate("""(function(){
      var b = document.getElementById('sort-bytes'); var out = [];
      for (var k = 0; k < 2; k++) { b.click();
        out.push(Array.from(document.querySelectorAll('#groups details.group'),
                            d => +d.getAttribute('data-bytes'))); }
      return out; })()""")
  assert order[0] == sorted(order[0], reverse=True) and order[1] == sorted(order[1])
  assert order[0][0] > order[0][-1]
  multi = next(g for g in groups if g.count > 1)
  rows = browser.evaluate(f"""(function(){{
      var d = Array.from(document.querySelectorAll('#groups details.group')).find(
          d => d.querySelector('summary').textContent.includes('x{multi.count}') &&
               d.getAttribute('data-bytes') === '{multi.bytes_saved}' &&
               d.getAttribute('data-class') === '{multi.kind.slug}');
      d.querySelector('summary').click();
      return [d.open, d.querySelector('table.sortable').tBodies[0].rows.length]; }})()""")
  assert rows == [True, multi.count]
  assert browser.errors() == []


def test_a_huge_module_aggregates_and_opens(browser, tmp_path):
  spec = importlib.util.spec_from_file_location("bench_html", BENCH)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  big = bench.tiled_report(report(), 400)
  assert big.module.instruction_count > 100_000
  path = tmp_path / "big.html"
  big.to_html(str(path))
  seen = len(browser.events)
  browser.load(path.as_uri())
  assert browser.errors(since=seen) == []
  mode, marks, groups, arcs = browser.evaluate("""(function(){
      var s = document.getElementById('memory');
      return [s.getAttribute('data-mode'), s.querySelectorAll('rect,polygon').length,
              document.querySelectorAll('#groups details.group').length,
              document.querySelectorAll('svg[aria-label="kernel graph"] path').length]; })()""")
  drawn = sum(1 for b in big.buffers if not b.internal and b.bytes > 0)
  assert mode == "columns" and drawn > html.MAX_BANDS
  assert marks <= 880 + len(hlo_audit.Lifetime)   # one column per pixel, one area per class
  assert groups == len(ranked_groups(report().findings))   # the copies group together
  tip = browser.evaluate("""(function(){
      var s = document.getElementById('memory');
      s.scrollIntoView({block: 'center'});
      var b = s.getBoundingClientRect();
      return [b.left + b.width / 2, b.top + b.height / 2]; })()""")
  browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=tip[0], y=tip[1])
  assert re.match(r"step \d+: .* live \(.*\); largest: ",
                  browser.evaluate("document.getElementById('mem-tip').textContent"))


def test_the_sweep_report_loads_with_its_plots(browser, tmp_path):
  pytest.importorskip("matplotlib")
  from hlo_audit._src.sweep import plots, report as sweep_report

  records = [{"id": f"p{i}", "target": "t", "status": "ok", "params": {"n": n},
              "seconds": {"compile": 0.5, "total": 0.6}, "error": None,
              "audit": {"kernels": 3, "materialized_bytes": n * 64, "peak_bytes": n * 96,
                        "xla_peak_bytes": n * 96, "peak_agreement": 0.0,
                        "bytes_saved": n * 32, "findings": 1, "actionable": 1,
                        "findings_by_class": {"unfused-epilogue": 1},
                        "bytes_saved_by_class": {"unfused-epilogue": n * 32}}}
             for i, n in enumerate((16, 32, 64, 128))]
  pngs = plots.plot_sweep(records, str(tmp_path), ["n"], title="t")
  page = tmp_path / "report.html"
  page.write_text(sweep_report.render_html("t", records, ["n"], pngs, str(tmp_path)))
  seen = len(browser.events)
  browser.load(page.as_uri())
  widths = browser.evaluate("Array.from(document.images, i => i.complete ? i.naturalWidth : 0)")
  assert len(widths) == 2 and min(widths) > 300
  assert browser.errors(since=seen) == []
  assert all(u.startswith("file://") for u in browser.requests(since=seen))

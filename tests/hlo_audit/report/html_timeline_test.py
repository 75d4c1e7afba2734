"""The HTML page's estimated timeline: the step and its split, every launch
drawn once (narrow bars merged), bars coloured by bound, the kernels a
finding names marked with the finding in the tooltip, names escaped, a small
drawing for many launches, and one sentence without an estimate."""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser
import json
import re
import types

import pytest

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.analysis.time_model import KernelTime, Launch, StepTime
from hlo_audit._src.report import html, text, trace
from hlo_audit._src.report.json_report import report_from_dict
from hlo_audit._src.report.units import fmt_time
# The small example, and two asynchronous all-gathers beside three kernels
# (few bars, each wider than a pixel, on two tracks): audited once, there.
from tests.hlo_audit.report.trace_test import gathers, transformer


@dataclasses.dataclass
class Mark:
  tag: str
  attrs: dict
  title: str = ""


class _Timeline(HTMLParser):
  """The bars (rects with a launch count) and markers of svg#step-timeline,
  each with its tooltip, and the row labels; text unescaped as a browser
  would."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.inside = False
    self.marks: list[Mark] = []
    self.labels: list[str] = []
    self._open: Mark | None = None
    self._in_text = False

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if tag == "svg" and a.get("id") == "step-timeline":
      self.inside = True
    elif self.inside and (tag == "rect" and "data-n" in a or tag == "path"):
      self._open = Mark(tag, a)
      self.marks.append(self._open)
    elif self.inside and tag == "text":
      self._in_text = True

  def handle_endtag(self, tag):
    if tag == "svg":
      self.inside = False
    elif tag in ("rect", "path"):
      self._open = None
    elif tag == "text":
      self._in_text = False

  def handle_data(self, data):
    if self._open is not None:
      self._open.title += data
    elif self._in_text:
      self.labels.append(data)


def timeline(page: str) -> _Timeline:
  p = _Timeline()
  p.feed(page)
  return p


def bars(page: str) -> list[Mark]:
  return [m for m in timeline(page).marks if m.tag == "rect"]


def _by_hand(report, names: list[str], launches: list[Launch], compute_bound=()):
  """`report` with a hand-made estimate: kernels `names` (memory-bound, but
  those in `compute_bound`), the `launches`."""
  kernels = tuple(KernelTime(name=n, bytes=1 << 20, matrix_flops=0, vector_flops=1 << 18,
                             transcendentals=0, launches=1,
                             memory_time=1e-7 if n in compute_bound else 2e-6,
                             compute_time=1e-6, launch_time=1e-7) for n in names)
  step = max(l.start + l.duration for l in launches)
  timing = StepTime(facts=report.timing.facts, kernels=kernels, step_time=step,
                    memory_time=step, compute_time=0.0, launch_time=0.0,
                    communication_time=0.0, launches=tuple(launches),
                    _by_name=types.MappingProxyType({k.name: k for k in kernels}))
  return dataclasses.replace(report, timing=timing)


def test_the_section_heads_with_the_estimated_step_and_its_split():
  r = gathers()
  page = r.to_html()
  start = page.index("<h2>Estimated timeline</h2>")
  assert start < page.index("<h2>Live bytes over the schedule</h2>")
  line = text.time_line(r)
  assert "communication" in line and fmt_time(r.timing.step_time) in line
  assert f"<p>{html._e(line)}; {fmt_time(r.timing.overlapped_communication)} of " \
         "communication hidden under kernels</p>" in page[start:]
  t = timeline(page)
  assert [l for l in t.labels if l in ("compute", "communication")] == ["compute",
                                                                        "communication"]
  assert fmt_time(r.timing.step_time) in t.labels


@pytest.mark.parametrize("audit", [transformer, gathers], ids=["example", "async-gathers"])
def test_every_launch_is_drawn_once_coloured_by_its_bound(audit):
  r = audit()
  drawn = bars(r.to_html())
  assert sum(int(b.attrs["data-n"]) for b in drawn) == sum(l.count for l in r.timing.launches)
  single = [b for b in drawn if b.attrs["data-n"] == "1" and " launches of " not in b.title]
  assert single
  for b in single:
    name = b.title.split(": ", 1)[0]
    k = r.timing.kernel(name)
    assert b.attrs["fill"] == html.BOUND_COLORS[k.bound.value], b.title
    assert f", {k.bound.value}-bound" in b.title
  assert all(float(b.attrs["width"]) >= html.MIN_BAR_PX for b in drawn)


def test_kernels_a_finding_names_are_marked_with_the_finding_in_the_tooltip():
  r = gathers()
  named = trace.findings_by_kernel(r)
  t = timeline(r.to_html())
  drawn = [m for m in t.marks if m.tag == "rect"]
  markers = [m for m in t.marks if m.tag == "path" and m.attrs.get("class") == "marker"]
  assert len(drawn) == 5
  for b in drawn:
    name = b.title.split(": ", 1)[0]
    assert ("found" in b.attrs.get("class", "")) == (name in named), name
    for f in named.get(name, ()):
      assert f.kind.value in b.title
  assert len(markers) == sum(1 for b in drawn if "found" in b.attrs.get("class", "")) > 0
  (ags,) = [b for b in drawn if b.title.startswith("ags: ")]
  assert ags.attrs["fill"] == html.BOUND_COLORS["communication"]
  exposed = next(f for f in named["ags"] if f.kind.slug == "exposed-collective")
  assert f"exposed communication at ags (saves ~{fmt_time(exposed.time_saved)} per step)" \
      in ags.title


def test_names_from_the_hlo_are_escaped():
  odd = '<b onmouseover="x()">fusion&amp;</b>'
  base = gathers()
  f = dataclasses.replace(base.actionable[0], producer=odd, consumers=())
  r = dataclasses.replace(_by_hand(base, [odd, "neg"], [Launch(odd, 0.0, 4e-6),
                                                        Launch("neg", 4e-6, 1e-6)]),
                          findings=(f,))
  page = r.to_html()
  section = page[page.index("<h2>Estimated timeline</h2>"):
                 page.index("<h2>Live bytes over the schedule</h2>")]
  assert "<b" not in section and "&amp;amp;" in section
  titles = [b.title for b in bars(page)]
  assert titles[0].startswith(odd + ": ") and f.kind.value in titles[0]


def test_thousands_of_launches_draw_one_mark_per_pixel_or_wider_bar():
  # 60,000 launches of 1 us, one in every thousand 10 ms long: the short ones
  # merge (the last ones too), the long ones are drawn one by one.
  launches, clock = [], 0.0
  for i in range(60_000):
    d = 1e-2 if i % 1000 == 500 else 1e-6
    launches.append(Launch("long" if d > 1e-3 else f"k{i % 7}", clock, d))
    clock += d
  r = _by_hand(gathers(), ["long", *(f"k{i}" for i in range(7))], launches)
  page = r.to_html()
  drawn = bars(page)
  svg = page[page.index('id="step-timeline"'):]
  svg = svg[:svg.index("</svg>")]
  assert sum(int(b.attrs["data-n"]) for b in drawn) == 60_000
  assert 60 <= len(drawn) <= 2 * 840
  assert sum(1 for b in drawn if b.title.startswith("long: ")) == 60
  assert len(svg) < 200_000


def test_the_time_axis_labels_its_ends_inside_and_centres_the_rest():
  svg = html.step_timeline_svg(gathers())
  anchors = re.findall(r'<text x="[^"]*" y="[^"]*" text-anchor="(\w+)">', svg)
  assert anchors[:5] == ["start", "middle", "middle", "middle", "end"]


def test_without_an_estimate_one_sentence_says_why():
  r = dataclasses.replace(gathers(), timing=None, notes=(
      "time not estimated: the device is unknown (name it: --device h200)",))
  page = r.to_html()
  assert ("<h2>Estimated timeline</h2>\n<p class=\"muted\">No timeline: the device is "
          "unknown (name it: --device h200).</p>") in page
  assert 'id="step-timeline"' not in page
  read = report_from_dict(json.loads(gathers().to_json()))
  page = read.to_html()
  assert text.time_line(read) in page
  assert "No timeline: the report was read from JSON, which keeps the estimate" in page
  assert 'id="step-timeline"' not in page


def test_a_step_that_takes_no_time_says_so_instead_of_drawing():
  # Launches that all take zero seconds leave nothing to scale the axis by:
  # one sentence, not a drawing (nor a division by zero).
  r = _by_hand(gathers(), ["k0", "k1"], [Launch("k0", 0.0, 0.0), Launch("k1", 0.0, 0.0)])
  assert r.timing.step_time == 0
  assert html.step_timeline_svg(r) == '<p class="muted">The estimated step takes no time.</p>'
  page = r.to_html()
  assert "The estimated step takes no time." in page and 'id="step-timeline"' not in page


def test_a_merged_bars_tooltip_names_its_longest_kernels_first():
  # 3,000 launches of five kernels, each shorter than a pixel: merged bars
  # whose tooltips list the kernels by their time in the bar, longest first.
  launches, clock = [], 0.0
  for i in range(3_000):
    d = (1 + i % 5) * 1e-7
    launches.append(Launch(f"k{i % 5}", clock, d))
    clock += d
  r = _by_hand(gathers(), [f"k{i}" for i in range(5)], launches)
  drawn = bars(r.to_html())
  merged = [b.title for b in drawn if "longest: " in b.title]
  assert merged
  # Merged or not, every bar of the one row sits at the row's y and height.
  assert len({(b.attrs["y"], b.attrs["height"]) for b in drawn}) == 1, drawn[:3]
  for title in merged:
    longest = title.split("longest: ")[1].split(";")[0].split(", ")
    assert [k.split(" ")[0] for k in longest][:2] == ["k4", "k3"], title
  # Each kernel's time is its launches' in the bar: five kernels, all
  # listed, add up to the bar's whole (to the printed digits).
  from hlo_audit._src.report.units import parse_time  # pylint: disable=import-outside-toplevel
  whole_bars = [t for t in merged if " of 5 kernels in " in t]
  assert whole_bars
  for title in whole_bars:
    whole = parse_time(title.split(" kernels in ")[1].split(" (")[0])
    parts = [parse_time(k.split(" ", 1)[1])
             for k in title.split("longest: ")[1].split(";")[0].split(", ")]
    assert sum(parts) == pytest.approx(whole, rel=0.02), title


def test_the_live_bytes_timeline_hovers_up_to_its_step_limit():
  # Each step's live bytes ride on the svg for the hover readout, as long as
  # the schedule is short enough to carry them.
  base = gathers()
  short = html.timeline_svg(dataclasses.replace(base, timeline=(1, 5, 3)))
  assert 'id="timeline"' in short and 'data-series="[1,5,3]"' in short
  at_limit = html.timeline_svg(dataclasses.replace(
      base, timeline=(7,) * html._HOVER_STEPS))
  assert 'id="timeline"' in at_limit
  long = html.timeline_svg(dataclasses.replace(base, timeline=(7,) * (html._HOVER_STEPS + 1)))
  assert 'id="timeline"' not in long and "data-series" not in long


def test_the_memory_view_grid_marks_zero_half_and_the_top_at_their_heights():
  svg = html.memory_svg(transformer(), width=960, height=320)
  grid = [float(m.group(1)) for m in re.finditer(
      r'<line x1="[\d.]+" x2="[\d.]+" y1="([\d.]+)" y2="\1" stroke="#d0d7de"', svg)]
  labels = re.findall(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="end">([^<]*)</text>', svg)
  assert len(grid) == 3 and len(labels) == 3
  zero, half, top = grid
  assert zero > half > top and abs((zero - half) - (half - top)) <= 0.2
  # Each label sits at its line and says its height: 0, half the top, the top.
  assert [round(float(yy) - 4, 1) for yy, _ in labels] == grid
  assert labels[0][1] == "0 B"


_SHORT = [Launch("short", i * 1e-7, 1e-7) for i in range(50)]  # under a pixel together


@pytest.mark.parametrize("launches, names", [
    # before a wide bar
    (_SHORT + [Launch("long", 5e-6, 1e-2)], ["short", "long"]),
    # before a gap, then a narrow one, then a wide one
    (_SHORT + [Launch("other", 1e-3, 1e-7), Launch("long", 2e-3, 1e-2)],
     ["short", "other", "long"]),
    # at the row's end
    ([Launch("long", 0.0, 1e-2)] + [Launch(l.kernel, 1e-2 + l.start, l.duration)
                                    for l in _SHORT], ["long", "short"]),
], ids=["before-a-wide-bar", "before-a-gap", "at-the-end"])
def test_narrow_launches_of_one_kernel_keep_that_kernels_tooltip(launches, names):
  # Narrow launches of one kernel merged into one bar: drawn as the
  # kernel's own bar, with its tooltip, wherever the merged bar ends.
  r = _by_hand(gathers(), ["short", "other", "long"], launches)
  drawn = bars(r.to_html())
  assert [b.title.split(": ", 1)[0] for b in drawn] == names, [b.title for b in drawn]
  assert [b.attrs["data-n"] for b in drawn] == [
      "50" if n == "short" else "1" for n in names]
  assert not any("launches of" in b.title for b in drawn)


@pytest.mark.parametrize("counts, folded", [((1, 1), False), ((1, 8), True), ((8, 8), True)])
def test_the_launch_count_says_loops_were_folded_when_any_bar_stands_for_several(
    counts, folded):
  launches = [Launch("a", 0.0, 1e-3, count=counts[0]), Launch("b", 1e-3, 1e-3, count=counts[1])]
  page = _by_hand(gathers(), ["a", "b"], launches).to_html()
  assert f"<p class=\"muted\">{sum(counts):,} launches" in page
  assert ("in 2 bars (loops folded: one bar per kernel" in page) == folded


def test_the_timeline_ends_just_below_its_time_axis():
  # Two rows (compute, communication): under them the axis's times, its
  # caption just below, and the drawing's end just below that.
  page = gathers().to_html()
  svg = page[page.index('id="step-timeline"'):]
  svg = svg[:svg.index("</svg>")]
  height = float(re.search(r'height="([\d.]+)"', svg).group(1))
  rows = [float(y) + float(h) for y, h in re.findall(
      r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" fill="#f6f8fa"/>', svg)]
  ends = [float(y) for y in re.findall(  # (a row's name is at an integer x)
      r'<text x="\d+\.\d" y="([\d.]+)" text-anchor="(?:start|end)">', svg)]
  caption = float(re.search(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="middle">estimated time from',
                            svg).group(1))
  assert len(rows) == 2 and len(set(ends)) == 1, (rows, ends)
  assert max(rows) < ends[0] < caption <= ends[0] + 24 and caption < height <= caption + 8, (
      rows, ends, caption, height)


def test_a_merged_bars_tooltip_splits_its_time_by_bound():
  # Memory-bound "m" and compute-bound "c" launches, each under a pixel,
  # alternating: one merged bar, 3 us of memory-bound time to 1 us.
  launches = [Launch("m" if i % 4 else "c", i * 1e-7, 1e-7) for i in range(40)]
  launches.append(Launch("long", 4e-6, 1e-2))
  r = _by_hand(gathers(), ["m", "c", "long"], launches, compute_bound=("c",))
  assert [r.timing.kernel(n).bound.value for n in ("m", "c")] == ["memory", "compute"]
  (merged,) = [b for b in bars(r.to_html()) if " launches of " in b.title]
  assert "40 launches of 2 kernels in 4.00 us (memory 75%, compute 25%)" in merged.title
  assert merged.attrs["fill"] == html.BOUND_COLORS["memory"]


def test_bars_fill_their_rows_height():
  # Compute's row first, then communication's: each bar as tall as its row.
  page = gathers().to_html()
  rows = re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" '
                    r'fill="#f6f8fa"/>', page)
  drawn = bars(page)
  assert len(rows) == 2 and drawn
  for b in drawn:
    assert (b.attrs["y"], b.attrs["height"]) in rows, (b.attrs, rows)


def test_the_peak_label_reads_away_from_the_edge_it_is_near():
  # A peak in the right part of the drawing is labelled to its left.
  base = gathers()

  def anchor(timeline):
    svg = html.timeline_svg(dataclasses.replace(base, timeline=timeline))
    return re.search(r'text-anchor="(\w+)" fill="#cf222e">peak ', svg).group(1)

  assert anchor((1, 9, 2, 2, 2, 2, 2, 2, 2, 2)) == "start"
  assert anchor((2, 2, 2, 2, 2, 2, 2, 2, 9, 1)) == "end"


def test_a_finding_that_saves_no_time_is_not_said_to_cost_it():
  f = types.SimpleNamespace(time_saved=0.0, kind=FindingKind.UNFUSED_EPILOGUE,
                            boundary="fusion.1", producer="fusion.1")
  assert html._finding_tip([f]) == "unfused epilogue at fusion.1 (saves ~0 s per step)"


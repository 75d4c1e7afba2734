"""Times the HTML report of a huge module: rendering in Python and opening in
headless Chromium, against the built-in example's page in the same run.

The huge module is synthesized: the audit of the built-in example (a
transformer training step, ~1.2k instructions) tiled COPIES times along the
schedule, as a deep unrolled model would be (400 copies: ~490k instructions,
~50k kernels, ~56k buffers, ~34k findings). Names are made unique per copy;
live ranges, the timeline and the peak are shifted per copy.

Prints seconds for each page (render, file size, Chromium load to the load
event plus a layout) and the big/small ratios. The issue's target: the huge
page opens in under 5 s.

Example:
  python scripts/bench_html.py --copies=400 --repeats=3
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

_COPIES = flags.DEFINE_integer("copies", 400, "Copies of the example's audit.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed page loads of each page.")


def tiled_report(report, copies: int):
  """`report` repeated `copies` times along the schedule (unique names)."""
  from hlo_audit import AuditReport

  n = len(report.timeline) or 1

  def rn(name: str, c: int) -> str:
    return f"{name}.c{c}" if name else name

  kernels, buffers, findings = [], [], []
  for c in range(copies):
    kernels += [dataclasses.replace(k, name=rn(k.name, c), time=k.time + c * n)
                for k in report.kernels]
    buffers += [dataclasses.replace(
        b, name=rn(b.name, c), instruction=rn(b.instruction, c), producer=rn(b.producer, c),
        consumers=tuple(rn(x, c) for x in b.consumers),
        live_range=(b.live_range[0] + c * n, b.live_range[1] + c * n)) for b in report.buffers]
    findings += [dataclasses.replace(
        f, producer=rn(f.producer, c), boundary=rn(f.boundary, c),
        consumers=tuple(rn(x, c) for x in f.consumers)) for f in report.findings]
  m = report.module
  info = dataclasses.replace(m, instruction_count=m.instruction_count * copies,
                             computation_count=m.computation_count * copies,
                             schedule_length=n * copies)
  return AuditReport(
      module=info, kernels=tuple(kernels), buffers=tuple(buffers), findings=tuple(findings),
      peak_bytes=report.peak_bytes, xla_peak_bytes=report.xla_peak_bytes,
      xla_reported_peak_bytes=report.xla_reported_peak_bytes,
      allocation_bytes=report.allocation_bytes, heap_peak_bytes=report.heap_peak_bytes,
      peak_time=report.peak_time, timeline=tuple(report.timeline) * copies,
      live_at_peak=report.live_at_peak, options=report.options)


def _load_seconds(browser, url: str) -> float:
  t0 = time.perf_counter()
  browser.load(url)
  browser.evaluate("document.body.getBoundingClientRect().height")  # layout done
  return time.perf_counter() - t0


def main(argv):
  del argv
  import hlo_audit
  from hlo_audit.examples import example

  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "hlo_audit",
                                  "report"))
  from headless_chromium import Chromium, find_chromium

  fn, args = example()
  small = hlo_audit.audit(fn, *args)
  big = tiled_report(small, _COPIES.value)
  print(f"huge module: {big.module.instruction_count} instructions, {len(big.kernels)} "
        f"kernels, {len(big.buffers)} buffers, {len(big.findings)} findings, "
        f"{len(big.timeline)} steps")
  chromium = find_chromium()
  with tempfile.TemporaryDirectory() as d:
    pages = {}
    for name, r in (("example", small), ("huge", big)):
      path = os.path.join(d, name + ".html")
      t0 = time.perf_counter()
      r.to_html(path)
      pages[name] = (path, time.perf_counter() - t0, os.path.getsize(path))
    loads = {name: [] for name in pages}
    if chromium is not None:
      with Chromium(chromium, width=1280, height=900, timeout=120) as browser:
        for _ in range(_REPEATS.value):
          for name, (path, _, _) in pages.items():
            loads[name].append(_load_seconds(browser, "file://" + path))
        errors = browser.errors()
    for name, (path, render, size) in pages.items():
      load = f"{statistics.median(loads[name]):.2f} s" if loads[name] else "n/a"
      print(f"{name:8s} render {render:6.2f} s  {size / 2 ** 20:7.2f} MiB  Chromium load {load}")
    if chromium is None:
      print("chromium not found (apt-get install -y chromium): loads not timed")
      return
    ratio_r = pages["huge"][1] / pages["example"][1]
    ratio_l = statistics.median(loads["huge"]) / statistics.median(loads["example"])
    print(f"huge / example: render x{ratio_r:.1f}, load x{ratio_l:.1f}; page errors: {errors or 'none'}")
    verdict = "under" if statistics.median(loads["huge"]) < 5 else "OVER"
    print(f"huge page opens in {statistics.median(loads['huge']):.2f} s ({verdict} the 5 s target)")


if __name__ == "__main__":
  app.run(main)

"""Measures what `paused_gc` saves on this Python, step by step.

Parses one large HLO module (the biggest in the corpus by default) under three
collector regimes, interleaved, in this one process:

  gc on          the collector runs as usual (the baseline);
  pause          collector off during the parse, back on after;
  pause+freeze   the same, then `gc.freeze(); gc.unfreeze()` (what `paused_gc`
                 does when no one else has frozen objects), which moves
                 everything the parse made to the oldest generation.

Each parse is followed by one young collection (`gc.collect(0)`), timed apart:
it is the collection the program meets next, and the one the freeze step is
meant to make cheap. Prints medians and the ratio of each regime's
parse + young collection to the baseline's (below 1.0 means faster).

Example:
  python scripts/bench_gc_pause.py --repeats=5
  python scripts/bench_gc_pause.py --hlo=/tmp/train_step.hlo
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

from absl import app, flags

_HLO = flags.DEFINE_string("hlo", None, "HLO text file (default: the corpus's largest).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed parses per regime.")

_CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "hlo_corpus")


def _default_hlo() -> str:
  folder = os.path.join(os.environ.get("HLO_CORPUS", _CORPUS), "xla_benchmarks")
  if not os.path.isdir(folder):
    raise app.UsageError(f"no corpus at {os.path.abspath(folder)}: pass --hlo")
  files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".hlo")]
  return max(files, key=os.path.getsize)


def _one(text: str, regime: str) -> tuple[float, float]:
  """(parse seconds, following young collection seconds) under `regime`."""
  from hlo_audit._src.hlo import parser

  gc.collect()
  if regime != "gc on":
    gc.disable()
  t0 = time.perf_counter()
  module = parser._Parser(text, None, True).parse()  # noqa: SLF001 - no pause inside
  if regime == "pause+freeze":
    gc.freeze()
    gc.unfreeze()
  gc.enable()
  t1 = time.perf_counter()
  gc.collect(0)
  t2 = time.perf_counter()
  del module
  return t1 - t0, t2 - t1


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  path = _HLO.value or _default_hlo()
  with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
    text = f.read()
  regimes = ("gc on", "pause", "pause+freeze")
  if gc.get_freeze_count():
    # Measured as if the frozen objects were ours to thaw (CPython 3.12 freezes
    # a few hundred of its own at start-up).
    print(f"note: {gc.get_freeze_count()} objects frozen at start; thawed by the "
          "first pause+freeze")
  _one(text, "gc on")  # warm up (imports, caches)
  times: dict[str, list[tuple[float, float]]] = {r: [] for r in regimes}
  for _ in range(_REPEATS.value):
    for r in regimes:
      times[r].append(_one(text, r))
  base = statistics.median(p + y for p, y in times["gc on"])
  print(f"Python {sys.version.split()[0]}, gc thresholds {gc.get_threshold()}, "
        f"{os.path.basename(path)} ({len(text) / 1e6:.1f} MB), median of "
        f"{_REPEATS.value}")
  print(f"{'regime':<14} {'parse s':>8} {'young gc s':>10} {'total s':>8} {'vs gc on':>8}")
  for r in regimes:
    parse = statistics.median(p for p, _ in times[r])
    young = statistics.median(y for _, y in times[r])
    total = statistics.median(p + y for p, y in times[r])
    print(f"{r:<14} {parse:8.3f} {young:10.4f} {total:8.3f} {total / base:8.2f}")


if __name__ == "__main__":
  app.run(main)

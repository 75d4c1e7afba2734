"""Times hlo_audit's HLO parser against XLA's C++ parser on a benchmark set.

The set: the built-in example's 12-layer train step (plain JAX), a Flax linen
LM train step, an Equinox LM train step (each compiled here; see
bench_models.py), and the largest real-model modules of
../shared/hlo_corpus/xla_benchmarks (gemma, llama, mixtral) when present.
Each module's text is parsed with `hlo_audit.parse_hlo` and with XLA's
`ParseAndReturnUnverifiedModule` (`jaxlib._hlo.hlo_module_from_text`),
interleaved in this one process; the table gives both medians, their ratio
(ours / XLA; below 1.0 means faster) and how many instruction statements
the fast path handed to the slow one. The floor column times a loop that
only matches each instruction line with the fast path's pattern and builds
its `Instruction`, checking nothing: what a parser built this way (Python
regular expressions, an object per instruction) cannot go below.

Example:
  python scripts/bench_parse.py --repeats=9
  python scripts/bench_parse.py --models=example --hlo=/tmp/train_step.hlo
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402  (a sibling script module)

_MODELS = flags.DEFINE_list("models", ["example", "flax", "equinox", "corpus"],
                            "Modules to time: example, flax, equinox, corpus.")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Timed parses of each parser, per module.")
_HLO = flags.DEFINE_multi_string("hlo", [], "Also time these HLO text files.")
_CACHE = flags.DEFINE_string(
    "cache_dir", os.path.join(tempfile.gettempdir(), "hlo_audit_bench"),
    "Where compiled modules are kept between runs ('' to always compile).")


def floor_parse(text: str) -> int:
  """The floor of a parser built like ours: each instruction line matched by
  the fast path's pattern and made an `Instruction`, with no check at all
  (names, operands, attributes, computations, uniquifying). What a pure
  Python parse cannot go below; not a parser."""
  from hlo_audit._src.gc_pause import paused_gc
  from hlo_audit._src.hlo import parser

  shapes: dict = {}
  made = 0
  match, find, pos, n = parser._FAST_LINE.match, text.find, 0, len(text)
  with paused_gc():
    while pos < n:
      m = match(text, pos)
      if m is None:  # not an instruction line: the next line
        pos = find("\n", pos) + 1 or n
        continue
      _, _, name, shape_text, word, ops, run = m.groups()
      shape = shapes.get(shape_text)
      if shape is None:
        shape = shapes[shape_text] = parser.parse_shape(shape_text)
      parser._make_instruction(name, word, shape, tuple(ops.split(", ")), run, (),
                               None, None, None, m.start(3), None)
      made += 1
      pos = m.end()
  return made


def time_parse(text: str, repeats: int) -> tuple[float, float, float, int, object]:
  """Median seconds of ours, XLA's parse and the floor (interleaved), the
  fast path's fallbacks, and our module."""
  from jaxlib import _hlo  # XLA's parser, the baseline

  import hlo_audit
  from hlo_audit._src.hlo.parser import parse_hlo_counting_fallbacks

  module, fallbacks = parse_hlo_counting_fallbacks(text)  # warm-up
  _hlo.hlo_module_from_text(text)
  floor_parse(text)
  ours, xla, floor = [], [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    hlo_audit.parse_hlo(text)
    ours.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _hlo.hlo_module_from_text(text)
    xla.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    floor_parse(text)
    floor.append(time.perf_counter() - t0)
  return (statistics.median(ours), statistics.median(xla), statistics.median(floor),
          fallbacks, module)


def modules(models, cache_dir):
  """(name, text, compile seconds or None) of the benchmark set."""
  for kind in models:
    if kind in bench_models.BUILDERS:
      text, compile_s = bench_models.compiled_text(kind, cache_dir or None)
      yield f"{kind} train step", text, compile_s
    elif kind == "corpus":
      found = bench_models.corpus_modules()
      if not found:
        print("(../shared/hlo_corpus is absent: corpus modules skipped)")
      for name, path in found:
        with open(path, encoding="utf-8") as f:
          yield name, f.read(), None
    else:
      raise app.UsageError(f"unknown model {kind!r}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  import jax
  print(f"jax {jax.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs; medians of {_REPEATS.value} interleaved parses")
  rows = []
  sources = list(modules(_MODELS.value, _CACHE.value))
  for path in _HLO.value:
    with open(path, encoding="utf-8") as f:
      sources.append((os.path.basename(path), f.read(), None))
  header = (f"{'module':32s} {'lines':>7s} {'instrs':>7s} {'MB':>6s} "
            f"{'ours ms':>8s} {'XLA ms':>8s} {'ratio':>6s} {'floor':>6s} {'fallbacks':>9s}")
  print(header)
  print("-" * len(header))
  for name, text, compile_s in sources:
    ours, xla, floor, fallbacks, module = time_parse(text, _REPEATS.value)
    rows.append((name, ours / xla, floor / xla))
    print(f"{name:32s} {text.count(chr(10)):7d} {module.instruction_count:7d} "
          f"{len(text) / 1e6:6.2f} {ours * 1e3:8.1f} {xla * 1e3:8.1f} "
          f"{ours / xla:6.2f} {floor / xla:6.2f} {fallbacks:9d}", flush=True)
  ratios = [r for _, r, _ in rows]
  print("-" * len(header))
  print(f"ratio ours/XLA: median {statistics.median(ratios):.2f}, "
        f"max {max(ratios):.2f} ({max(rows, key=lambda r: r[1])[0]}); "
        f"goal: every ratio <= 1.0, median <= 0.8")
  print(f"floor/XLA (match each line, build its Instruction, check nothing): "
        f"median {statistics.median(r for _, _, r in rows):.2f}")


if __name__ == "__main__":
  app.run(main)

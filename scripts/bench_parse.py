"""Times hlo_audit's HLO parser against XLA's C++ parser on a benchmark set.

The set: the built-in example's 12-layer train step (plain JAX), a Flax linen
LM train step, an Equinox LM train step (each compiled here; see
bench_models.py), and the largest real-model modules of
../shared/hlo_corpus/xla_benchmarks (gemma, llama, mixtral) when present.
Each module's text is parsed with `hlo_audit.parse_hlo` and with XLA's
`ParseAndReturnUnverifiedModule` (`jaxlib._hlo.hlo_module_from_text`),
interleaved in this one process; the table gives both medians and their
ratio (ours / XLA; below 1.0 means faster).

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


def time_parse(text: str, repeats: int) -> tuple[float, float, object]:
  """Median seconds of ours and XLA's parse (interleaved), and our module."""
  from jaxlib import _hlo  # XLA's parser, the baseline

  import hlo_audit

  module = hlo_audit.parse_hlo(text)  # warm-up
  _hlo.hlo_module_from_text(text)
  ours, xla = [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    hlo_audit.parse_hlo(text)
    ours.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _hlo.hlo_module_from_text(text)
    xla.append(time.perf_counter() - t0)
  return statistics.median(ours), statistics.median(xla), module


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
            f"{'ours ms':>8s} {'XLA ms':>8s} {'ratio':>6s}")
  print(header)
  print("-" * len(header))
  for name, text, compile_s in sources:
    ours, xla, module = time_parse(text, _REPEATS.value)
    rows.append((name, ours / xla))
    print(f"{name:32s} {text.count(chr(10)):7d} {module.instruction_count:7d} "
          f"{len(text) / 1e6:6.2f} {ours * 1e3:8.1f} {xla * 1e3:8.1f} "
          f"{ours / xla:6.2f}", flush=True)
  ratios = [r for _, r in rows]
  print("-" * len(header))
  print(f"ratio ours/XLA: median {statistics.median(ratios):.2f}, "
        f"max {max(ratios):.2f} ({max(rows, key=lambda r: r[1])[0]}); "
        f"goal: every ratio <= 1.0, median <= 0.8")


if __name__ == "__main__":
  app.run(main)

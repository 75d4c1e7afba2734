"""Benchmark Pallas kernels against the XLA baseline measured in the same run.

For every case of `--tags` (default "bench": realistic sizes such as 8192x8192
bfloat16 norms) of each op in `--ops`, times the kernel and XLA (median of
`--repeats` after `--warmup`), and prints time, achieved GB/s and TFLOP/s, %
of the device roofline (`pallas_kernels/_src/devices.py`) and the ratio
speedup = xla_time / kernel_time. `--out` writes <out>.json (all fields) and
<out>.md (the table). In interpret mode (no GPU) the report says plainly that
the timings mean nothing.

Usage:
  python scripts/bench_kernels.py --ops=layer_norm,rms_norm,softmax \
      --tags=bench --repeats=20 --out=out/bench
"""

from __future__ import annotations

import pathlib
import sys

from absl import app
from absl import flags

# Runnable from a checkout without installing the package.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pallas_kernels as pk  # noqa: E402
from pallas_kernels._src import registry  # noqa: E402


def _define_flags() -> None:
  # Defined only when run as a script, so tests can import run() without
  # clashing with other scripts' flags of the same names.
  flags.DEFINE_list("ops", None, "Ops to benchmark (default: all registered).")
  flags.DEFINE_list("tags", ["bench"], "Case tags to run.")
  flags.DEFINE_string("out", None, "Write <out>.json and <out>.md here.")
  flags.DEFINE_integer("repeats", 20, "Timed calls per implementation.")
  flags.DEFINE_integer("warmup", 3, "Untimed calls first (compiles).")
  flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")


def run(ops: list[str] | None, tags: list[str], *, out: str | None = None,
        repeats: int = 20, warmup: int = 3, seed: int = 0) -> pk.BenchReport:
  """Benchmarks, prints ratios against XLA and writes the results files."""
  names = ops or list(registry.spec_names())
  report = pk.bench(names, tags=tags, repeats=repeats, warmup=warmup, seed=seed)
  print(report)
  print()
  for row in report.rows:
    if row.speedup is None:
      print(f"{row.op:12s} {row.case:55s} no speed-up: the kernel call fell back to XLA "
            f"({row.fallback})")
      continue
    verdict = "faster" if row.speedup > 1 else "slower"
    print(f"{row.op:12s} {row.case:55s} kernel/XLA: {row.speedup:6.2f}x {verdict} "
          f"({row.kernel_ms:.3f} ms vs {row.xla_ms:.3f} ms)")
  if out:
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(report.to_json() + "\n")
    path.with_suffix(".md").write_text(report.to_markdown() + "\n")
  return report


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  run(f.ops, f.tags, out=f.out, repeats=f.repeats, warmup=f.warmup, seed=f.seed)
  sys.exit(0)


if __name__ == "__main__":
  _define_flags()
  app.run(main)

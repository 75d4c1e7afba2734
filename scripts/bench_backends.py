"""Time the matmul's Mosaic GPU and Triton kernels and XLA side by side.

For every matmul case of `--tags` (default "backends": JAX's Hopper matmul
shapes, bf16 4096^3 and the docs' 8192x512x8192 bias+GELU+residual, and an
int8-weight decode product), times the kernel built with each Pallas backend
and XLA's own computation of the same call, in one process on the same
inputs (median of `--repeats` after `--warmup`, each synchronised), and
prints one row per case with the three times and their ratios. `--out`
writes <out>.json and <out>.md. On a machine without a GPU the kernels are
interpreted and the table says the timings mean nothing; no speed is
claimed from such a run.

Usage:
  python scripts/bench_backends.py --tags=backends --repeats=20 --out=out/backends
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from absl import app
from absl import flags

# Runnable from a checkout without installing the package.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pallas_kernels as pk  # noqa: E402

BACKENDS = ("mosaic_gpu", "triton")


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
  """One case: each backend's kernel time, XLA's, and what was built."""

  case: str
  #: backend -> (median ms, the backend(s) actually timed, fallback or None).
  kernels: dict
  xla_ms: float

  def ratio(self, backend: str) -> float | None:
    ms, built, fallback = self.kernels[backend]
    return None if fallback or backend not in built else self.xla_ms / ms


def run(tags: list[str], *, repeats: int = 20, warmup: int = 3, out: str | None = None,
        seed: int = 0) -> list[Row]:
  reports = {b: pk.bench("matmul", tags=tags, repeats=repeats, warmup=warmup, seed=seed,
                         kernel_backend=b) for b in BACKENDS}
  first = reports[BACKENDS[0]]
  rows = []
  for i, r in enumerate(first.rows):
    kernels = {}
    for b in BACKENDS:
      row = reports[b].rows[i]
      kernels[b] = (row.kernel_ms, row.backend, row.fallback)
    rows.append(Row(r.case, kernels, r.xla_ms))
  lines = [f"matmul backends on {first.device}, median of {repeats} after {warmup} warm-up"]
  if first.warning:
    lines.append(first.warning)
  head = ("| case | mosaic_gpu ms | triton ms | xla ms | xla/mosaic_gpu | xla/triton | "
          "triton/mosaic_gpu |")
  lines += ["", head, "|---|---:|---:|---:|---:|---:|---:|"]

  def ratio(v):
    return "fell back" if v is None else f"{v:.2f}x"

  for row in rows:
    mo, tr = row.kernels["mosaic_gpu"], row.kernels["triton"]
    mosaic_vs_triton = (None if row.ratio("mosaic_gpu") is None or row.ratio("triton") is None
                        else tr[0] / mo[0])
    lines.append(f"| {row.case} | {mo[0]:.4f} | {tr[0]:.4f} | {row.xla_ms:.4f} | "
                 f"{ratio(row.ratio('mosaic_gpu'))} | {ratio(row.ratio('triton'))} | "
                 f"{ratio(mosaic_vs_triton)} |")
  for row in rows:
    for b, (_, built, fallback) in row.kernels.items():
      if fallback or b not in built:
        lines.append(f"- {row.case}: {b} was not timed ({built}): {fallback or 'see guard'}")
  text = "\n".join(lines)
  print(text)
  if out:
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text(text + "\n")
    path.with_suffix(".json").write_text(json.dumps({
        "device": first.device, "interpret": first.interpret, "repeats": repeats,
        "rows": [{"case": r.case, "xla_ms": r.xla_ms,
                  "kernels": {b: {"ms": v[0], "built": v[1], "fallback": v[2]}
                              for b, v in r.kernels.items()}} for r in rows]}, indent=2))
  return rows


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  run(f.tags, repeats=f.repeats, warmup=f.warmup, out=f.out, seed=f.seed)


if __name__ == "__main__":
  flags.DEFINE_list("tags", ["backends"], "Matmul case tags to time.")
  flags.DEFINE_string("out", None, "Write <out>.json and <out>.md here.")
  flags.DEFINE_integer("repeats", 20, "Timed calls per implementation.")
  flags.DEFINE_integer("warmup", 3, "Untimed calls first (compiles).")
  flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
  app.run(main)

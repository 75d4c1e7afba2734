"""Audits the sharded real-model modules of the HLO corpus and prints a
Markdown table: per-device peak, collectives, bytes each device sends per
step, and the sharding and memory findings.

Usage:
  python scripts/sharded_corpus.py [CORPUS_DIR] [MODULE.hlo ...]
(default: ../shared/hlo_corpus/xla_benchmarks and its llama/mixtral modules)
"""

from __future__ import annotations

import collections
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hlo_audit import audit_hlo  # noqa: E402

_KINDS = ("exposed-collective", "reshard-around-collective", "collective-matmul",
          "replicated-buffer", "undonated-argument", "remat-candidate", "costly-remat")


def main(argv: list[str]) -> int:
  root = pathlib.Path(argv[0]) if argv else (
      pathlib.Path(__file__).resolve().parents[2] / "shared/hlo_corpus/xla_benchmarks")
  names = argv[1:] or sorted(p.name for p in root.glob("hlo_*.hlo")
                             if "llama" in p.name or "mixtral" in p.name)
  if not root.is_dir():
    print(f"no corpus at {root}", file=sys.stderr)
    return 2
  print("| module | instructions | partitions | peak per device | collectives | "
        "bytes sent per device per step | findings (sharding, memory) | audit s |")
  print("|---|---:|---:|---:|---|---:|---|---:|")
  for name in names:
    t = time.perf_counter()
    r = audit_hlo(root / name)
    dt = time.perf_counter() - t
    kinds = collections.Counter(f.kind.slug for f in r.findings if f.kind.slug in _KINDS)
    colls = collections.Counter(c.opcode for c in r.collectives)
    sent = sum(c.bytes_sent * (c.trip_count or 1) for c in r.collectives)
    parts = r.program.module.attributes.get("num_partitions", "-")
    print(f"| `{name.removesuffix('__1.hlo')}` | {r.module.instruction_count:,} | {parts} | "
          f"{r.peak_bytes / 2**30:.2f} GiB | "
          + ", ".join(f"{v} {k}" for k, v in colls.most_common())
          + f" | {sent / 2**30:.2f} GiB | "
          + (", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "none")
          + f" | {dt:.1f} |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

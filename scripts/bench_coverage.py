"""How much of what the audit finds on an H200 our fixes cover.

For each ground-truth suite model compiled for an H200 (the committed XLA:GPU
compiles of tests/hlo_audit/real_models/h200, made without a GPU) and the
built-in example, audits the program as priced on an H200 and splits the
traffic (`bytes_saved`) of its actionable findings into:

  kernel runs   a kernel library names a call and its guard passes on the
                H200 for the finding's shapes (pallas_kernels' ops, JAX's
                own fused calls);
  kernel named  a call is named but its guard sends these shapes to XLA;
  program       the fix is a change to the program (hoist, remat, a
                layout), not a kernel;
  uncovered     no fix is named; the largest such kinds are listed.

With --swap it also measures what the swap closes: each model's step is
compiled for an H200 as it is and with `pallas_kernels.swap` (built for the
H200), both are audited, and the actionable bytes of the findings gone from
the swapped program (matched by class, shape, line and work, as `verify`
matches them) are the share closed; findings the swapped program adds are
counted against it ("net").

Run: python scripts/bench_coverage.py [MODEL ...] [--swap] [--json FILE]
(JAX_PLATFORMS=cpu; no GPU needed: the compiles are committed; --swap
compiles live and needs the gpu-target extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: Compiles of one model in another configuration, held by rule tests: not
#: programs of their own.
_VARIANTS = ("cublas_mlp", "dp_mlp", "swapped_example")

_SPLIT = ("runs", "named", "program", "uncovered")


def _share(finding) -> str:
  if finding.kernel:
    return "runs" if finding.guard_verdict.startswith("kernel runs") else "named"
  guard = finding.guard
  if finding.need is None and (finding.kind.fix in ("donate", "remat") or
                               guard.startswith(("n/a: a change to the program",
                                                 "none needed"))):
    return "program"
  return "uncovered"


def coverage(name: str, text: str):
  """(bytes by share, bytes by library, uncovered bytes by (class, work))."""
  import hlo_audit
  r = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="h200"))
  by_share = dict.fromkeys(_SPLIT, 0)
  by_library = collections.Counter()
  missing = collections.Counter()
  for f in r.actionable:
    if f.kind is hlo_audit.FindingKind.UNDONATED_ARGUMENT:
      continue  # capacity, not traffic
    share = _share(f)
    by_share[share] += f.bytes_saved
    if f.kernel:
      by_library[f.kernel.split(".", 1)[0]] += f.bytes_saved
    if share == "uncovered":
      missing[(f.kind.slug, ",".join(f.ops[:3]))] += f.bytes_saved
  return by_share, by_library, missing


def _traffic(report) -> list:
  import hlo_audit
  return [f for f in report.actionable
          if f.kind is not hlo_audit.FindingKind.UNDONATED_ARGUMENT]


def closed(name: str):
  """(actionable bytes before, after, gone, added, XLA's footprint before,
  after) when the swap goes into model `name`'s step, both programs
  compiled live for an H200; or a one-line reason the swap or a compile
  failed."""
  import jax

  import hlo_audit
  import pallas_kernels
  from tests.hlo_audit.real_models import h200_support
  options = hlo_audit.AuditOptions(device="h200")
  fn, args = h200_support.program(name)
  try:
    if name == h200_support.EXAMPLE:
      # The CLI's swap of the example (its loss swapped, the step around it),
      # planned and built for the H200 as every other program's.
      swapped, args_after = h200_support.swapped_example_program("h200")
    else:
      g = pallas_kernels.swap(fn, target="h200")
      swapped, args_after = (jax.jit(g, donate_argnums=_donated(fn, args))
                             if hasattr(fn, "trace") else g), args
    text, fp_before = h200_support.compile_with_footprint(fn, args)
    before = hlo_audit.audit_hlo(text, options=options)
    text, fp_after = h200_support.compile_with_footprint(swapped, args_after)
    after = hlo_audit.audit_hlo(text, options=options)
  except Exception as e:  # noqa: BLE001 - a model the swap cannot take is a row
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
  traffic, left = _traffic(before), _traffic(after)
  mine, theirs = {id(f) for f in traffic}, {id(f) for f in left}
  diff = before.diff(after)
  gone = sum(f.bytes_saved for f in diff.findings_removed if id(f) in mine)
  added = sum(f.bytes_saved for f in diff.findings_added if id(f) in theirs)
  return (sum(f.bytes_saved for f in traffic), sum(f.bytes_saved for f in left),
          gone, added, fp_before, fp_after)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("models", nargs="*", help="suite models (default: all and the example)")
  parser.add_argument("--json", help="write the table as JSON here")
  parser.add_argument("--top", type=int, default=12, help="uncovered kinds to list")
  parser.add_argument("--swap", action="store_true",
                      help="also measure the share the swap closes (compiles live)")
  args = parser.parse_args(argv)

  from tests.hlo_audit.real_models import h200_support
  names = args.models or sorted(
      p.name.removesuffix(".hlo.gz") for p in h200_support.HERE.glob("*.hlo.gz")
      if p.name.removesuffix(".hlo.gz") not in _VARIANTS)
  mib = 2.0 ** 20
  total = dict.fromkeys(_SPLIT, 0)
  libraries = collections.Counter()
  missing = collections.Counter()
  rows = []
  print(f"{'model':18s} {'actionable':>11s} {'runs':>6s} {'named':>6s} {'program':>8s} "
        f"{'uncovered':>9s}  libraries")
  for name in names:
    share, libs, miss = coverage(name, h200_support.fixture(name))
    b = sum(share.values())
    for k in _SPLIT:
      total[k] += share[k]
    libraries.update(libs)
    missing.update(miss)
    pct = {k: 100 * share[k] / b if b else 0.0 for k in _SPLIT}
    rows.append({"model": name, "actionable_bytes": b, **{f"{k}_bytes": share[k] for k in _SPLIT},
                 "libraries": dict(libs)})
    print(f"{name:18s} {b / mib:8.1f} MiB {pct['runs']:5.0f}% {pct['named']:5.0f}% "
          f"{pct['program']:7.0f}% {pct['uncovered']:8.0f}%  "
          f"{', '.join(f'{k} {v / mib:.1f}' for k, v in libs.most_common())}")
  b = sum(total.values())
  fixed = total["runs"] + total["named"] + total["program"]
  print(f"{'all':18s} {b / mib:8.1f} MiB "
        + " ".join(f"{100 * total[k] / b:5.0f}%" + (" " if k == 'program' else "")
                   for k in _SPLIT))
  print(f"\na fix named for {100 * fixed / b:.1f}% of the actionable bytes "
        f"(a kernel for {100 * (total['runs'] + total['named']) / b:.1f}%, one that runs "
        f"on the H200 for {100 * total['runs'] / b:.1f}%)")
  print("\nlargest uncovered (class, work): MiB")
  for (kind, work), v in missing.most_common(args.top):
    print(f"  {v / mib:8.1f}  {kind} ({work})")
  swap_rows = _swap_table(names) if args.swap else []
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"rows": rows, "total": total, "libraries": dict(libraries),
                 "swap": swap_rows}, f, indent=1)
  return 0


def _donated(fn, args) -> tuple[int, ...]:
  """The positions of the arguments jitted `fn` donates whole (its trace's
  `args_info`), so that the swapped step donates what the step did."""
  import jax
  info, _ = fn.trace(*args).args_info
  return tuple(i for i, a in enumerate(info)
               if jax.tree.leaves(a) and all(x.donated for x in jax.tree.leaves(a)))


def _swap_table(names) -> list[dict]:
  """The share of each model's actionable bytes the swap closes: the drop
  from before to after. A finding re-keyed by the swap (the same gap read
  off a kernel of ours) counts as gone and as added, so the drop, not the
  gone share, is the figure."""
  print(f"\nclosed by the swap (both compiled live for an H200; gone and added "
        f"by finding):\n{'model':18s} {'before':>10s} {'after':>10s} {'closed':>7s} "
        f"{'gone':>6s} {'added':>6s}  XLA's footprint before -> after")
  rows, sums = [], [0] * 6
  for name in names:
    got = closed(name)
    if isinstance(got, str):
      print(f"{name:18s} swap or compile failed: {got}")
      rows.append({"model": name, "error": got})
      continue
    for i, v in enumerate(got):
      sums[i] += v
    rows.append(dict(zip(("model", "before_bytes", "after_bytes", "gone_bytes",
                          "added_bytes", "footprint_before", "footprint_after"),
                         (name, *got))))
    _swap_row(name, *got)
  if sums[0]:
    _swap_row("all", *sums)
    print(f"\nthe swap closes {100 * (sums[0] - sums[1]) / sums[0]:.1f}% of the "
          f"actionable bytes of the programs it compiled")
  return rows


def _swap_row(name: str, before: int, after: int, gone: int, added: int,
              fp_before: int, fp_after: int) -> None:
  mib = 2.0 ** 20
  pct = (lambda v: 100 * v / before if before else 0.0)
  grew = 100 * (fp_after - fp_before) / fp_before if fp_before else 0.0
  print(f"{name:18s} {before / mib:6.1f} MiB {after / mib:6.1f} MiB "
        f"{pct(before - after):6.0f}% {pct(gone):5.0f}% {pct(added):5.0f}%  "
        f"{fp_before / mib:8.1f} -> {fp_after / mib:8.1f} MiB ({grew:+.0f}%)")


if __name__ == "__main__":
  sys.exit(main())

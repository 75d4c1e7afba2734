r"""The time model held against measured kernel times, on this machine's device.

For each program of the ground-truth suite (tests/hlo_audit/real_models: flax
linen and nnx, equinox, optax train steps) and the built-in example, compiles
it for this machine's default backend, audits it (the estimate:
`report.timing`, priced with this machine's calibrated CPU facts, or a GPU's
from XLA's spec of it), runs it under JAX's profiler (`--runs` times after
warm-up runs; XLA names each kernel's trace event after its HLO instruction)
and compares, per program:

  spearman  rank correlation of estimated and measured per-kernel times,
            over the kernels that take >= 1% of the measured step;
  step      the estimated step over the measured one (the span from the
            first kernel's start to the last kernel's end, median of runs).

Goals (per program): spearman >= 0.8, step within 0.67x - 1.5x.

Usage:
  python scripts/bench_time_model.py                      # every program
  python scripts/bench_time_model.py --models=lstm,example --verbose
  python scripts/bench_time_model.py --recalibrate        # measure the CPU again
  python scripts/bench_time_model.py --json=out.json      # the rows as JSON

Exit codes: 0 printed (whatever the scores), 2 bad flags or missing extras.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_MODELS = flags.DEFINE_list("models", None, "programs to run (default: all)")
_RUNS = flags.DEFINE_integer("runs", 7, "profiled runs per program")
_RECALIBRATE = flags.DEFINE_bool("recalibrate", False, "measure this CPU again first")
_VERBOSE = flags.DEFINE_bool("verbose", False, "list each program's largest kernels")
_JSON = flags.DEFINE_string("json", None, "also write the rows to this JSON file")

#: Kernels taking at least this share of the measured step are ranked.
MIN_SHARE = 0.01
SPEARMAN_GOAL = 0.8
STEP_RANGE = (0.67, 1.5)


def rank(values: list[float]) -> list[float]:
  """Ranks from 1, ties sharing their average rank."""
  order = sorted(range(len(values)), key=values.__getitem__)
  ranks = [0.0] * len(values)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    for k in range(i, j + 1):
      ranks[order[k]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
  """Spearman's rank correlation (None under three points or a constant side)."""
  if len(a) < 3:
    return None
  ra, rb = rank(a), rank(b)
  ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
  cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
  va = sum((x - ma) ** 2 for x in ra) ** 0.5
  vb = sum((y - mb) ** 2 for y in rb) ** 0.5
  if not va or not vb:
    return None
  return cov / (va * vb)


def programs():
  """(name, build) of the built-in example and the suite's programs (those
  whose libraries are installed: a GPU machine may lack flax)."""
  def example():
    from hlo_audit.examples import example as build
    return build()

  out = [("example", example)]
  try:
    from tests.hlo_audit.real_models import truth  # noqa: PLC0415
  except ImportError as e:
    print(f"bench_time_model: the suite's models need {e.name}: the example alone",
          file=sys.stderr)
    return out
  for name in truth.MODELS:
    if truth.missing_library(name):
      continue
    try:
      out.append((name, truth.model(name).build))
    except ImportError as e:
      print(f"bench_time_model: {name} needs {e.name}: skipped", file=sys.stderr)
  return out


def concrete(args):
  """Arrays for `jax.ShapeDtypeStruct`s (zeros), arrays as they are."""
  import jax
  import jax.numpy as jnp

  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jnp.zeros(x.shape, x.dtype)
    return x

  return jax.tree.map(leaf, args)


def measure(name: str, build, runs: int) -> dict:
  import jax
  import jax.numpy as jnp

  import hlo_audit

  fn, args = build()
  if not hasattr(fn, "lower"):
    fn = jax.jit(fn)
  args = concrete(args)
  report = hlo_audit.audit(fn, *args)
  step = report.timing
  if step is None:
    raise SystemExit(f"bench_time_model: {name}: no estimate ({'; '.join(report.notes)})")
  names = [k.name for k in report.kernels]

  def fresh():  # donating programs consume their arguments
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x,
                        args)

  # XLA:CPU's Eigen dots and convolutions run asynchronously: their events
  # end before their work does (hlo_audit.profile_kernels).
  eigen = {k.name for k in report.kernels
           if report.module.platform == "cpu" and k.opcode in ("dot", "convolution")}
  try:
    measured = hlo_audit.profile_kernels(fn, *args, runs=runs, kernels=names,
                                         module=report.module.name, fresh_args=fresh,
                                         asynchronous=eigen)
  except hlo_audit.HloAuditError as e:  # a trace that names no kernel: say so
    return {"model": name, "error": str(e), "kernels": len(names), "ranked": 0,
            "spearman": None, "step_estimated_s": step.step_time, "step_measured_s": None,
            "step_ratio": None, "top": [], "all": []}
  floor = MIN_SHARE * measured.step_time
  ranked = [n for n in names if measured.kernel_times.get(n, 0.0) >= floor
            and step.kernel(n) is not None]
  est = [step.kernel(n).time for n in ranked]
  got = [measured.kernel_times[n] for n in ranked]
  rho = spearman(est, got)
  ratio = step.step_time / measured.step_time if measured.step_time else None
  row = {"model": name, "kernels": len(names), "ranked": len(ranked),
         "spearman": rho, "step_estimated_s": step.step_time,
         "step_measured_s": measured.step_time, "step_ratio": ratio,
         "kernel_time_measured_s": measured.kernel_time,
         "top": [{"kernel": n, "estimated_s": step.kernel(n).time,
                  "measured_s": measured.kernel_times[n],
                  "bound": step.kernel(n).bound.value,
                  "kind": report.kernel(n).kind.value,
                  "estimate": step.kernel(n).to_dict()}
                 for n in sorted(ranked, key=lambda n: -measured.kernel_times[n])],
         "all": [{"kernel": n, "measured_s": measured.kernel_times.get(n, 0.0),
                  "kind": report.kernel(n).kind.value, "estimate": step.kernel(n).to_dict()}
                 for n in names if step.kernel(n) is not None]}
  return row


def main(argv) -> int:
  del argv
  import jax
  from absl import logging

  logging.set_verbosity(logging.WARNING)  # the profiler logs every trace it writes

  wanted = dict(programs())
  names = _MODELS.value or list(wanted)
  unknown = sorted(set(names) - set(wanted))
  if unknown:
    print(f"bench_time_model: unknown programs {unknown}; known: {', '.join(wanted)}",
          file=sys.stderr)
    return 2
  import hlo_audit

  if jax.default_backend() == "cpu":
    facts = hlo_audit.cpu_facts(recalibrate=_RECALIBRATE.value)
  else:
    facts = hlo_audit.device_facts(jax.devices()[0].device_kind)
  print(f"jax {jax.__version__}, {facts.description}: memory "
        f"{facts.memory_bandwidth / 1e9:.1f} GB/s, f32 matmul "
        f"{facts.matrix_rate('f32') / 1e9:.0f} GFLOP/s, bf16 "
        f"{facts.matrix_rate('bf16') / 1e9:.0f} GFLOP/s, launch "
        f"{facts.launch_overhead * 1e6:.2f} us ({facts.checked})")
  print(f"{'program':16} {'kernels':>7} {'ranked':>6} {'spearman':>8} {'estimated':>10} "
        f"{'measured':>10} {'ratio':>6}  goals")
  rows = []
  for name in names:
    row = measure(name, wanted[name], _RUNS.value)
    rows.append(row)
    if "error" in row:
      print(f"{name:16} not measured: {row['error']}")
      continue
    rho, ratio = row["spearman"], row["step_ratio"]
    ok = (rho is not None and rho >= SPEARMAN_GOAL and ratio is not None
          and STEP_RANGE[0] <= ratio <= STEP_RANGE[1])
    print(f"{name:16} {row['kernels']:7d} {row['ranked']:6d} "
          f"{rho if rho is not None else float('nan'):8.3f} "
          f"{row['step_estimated_s'] * 1e3:8.3f}ms {row['step_measured_s'] * 1e3:8.3f}ms "
          f"{ratio:6.2f}  {'met' if ok else 'NOT met'}")
    if _VERBOSE.value:
      for t in row["top"][:12]:
        e = t["estimate"]
        traits = "".join(c for c, on in (("S", e["strided"]), ("P", e["parallel"]),
                                         ("R", e["reduce_elements"])) if on)
        print(f"    {t['kernel'][:32]:32} est {t['estimated_s'] * 1e6:9.1f} us  "
              f"measured {t['measured_s'] * 1e6:9.1f} us  {t['bound']:8} "
              f"{t['kind'][:12]:12} {traits:3} {e['bytes'] / 2**20:7.3f} MiB "
              f"{(e['matrix_flops'] + e['vector_flops']) / 1e6:8.2f} MFLOP")
  met = sum(1 for r in rows if r["spearman"] is not None and r["spearman"] >= SPEARMAN_GOAL
            and STEP_RANGE[0] <= (r["step_ratio"] or 0) <= STEP_RANGE[1])
  print(f"goals met on {met} of {len(rows)} programs (spearman >= {SPEARMAN_GOAL}, "
        f"step within {STEP_RANGE[0]}x-{STEP_RANGE[1]}x)")
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(
        {"jax": jax.__version__, "device": facts.to_dict(), "rows": rows}, indent=1))
  return 0


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))

"""Times one sweep grid on the local worker pool and on a local Ray cluster of
the same cores: the cost Ray adds per point, as a ratio.

The grid (200 points by default) audits a small function (`x @ w` and an
epilogue, batch 8..1600), so that a point is mostly the sweep's own work
(compile and audit, about 0.1 s) and the executor's cost shows. Both
executors run in this process's sweep (it writes the results, as a user's
would): first `jobs` local worker processes, then a Ray cluster this script
starts with `num_cpus=jobs` (on loopback; its start is timed apart, as a
cluster is usually there before a sweep). Each sweep's seconds include its
workers' start-up (importing JAX), also printed apart: the time to the first
finished point.

Example:
  python scripts/bench_sweep_ray.py
  python scripts/bench_sweep_ray.py --points=50 --jobs=2
"""

from __future__ import annotations

import os
import tempfile
import time

# Ray's single-machine mode (every address on loopback); read when Ray is
# imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_POINTS = flags.DEFINE_integer("points", 200, "Grid points (batch sizes).")
_JOBS = flags.DEFINE_integer("jobs", 2, "Local worker processes, and the Ray cluster's CPUs.")

MODEL = """\
import jax.numpy as jnp

def f(x, w):
  return jnp.tanh(x @ w + 1.0)
"""


def run(name: str, folder: str, **kw) -> dict:
  from hlo_audit import SweepOptions, SweepReporter, run_sweep

  times: list[float] = []

  class Clock(SweepReporter):
    def point(self, record, done, total):
      times.append(time.perf_counter())

  grid = "b=" + ",".join(str(8 * (i + 1)) for i in range(_POINTS.value)) + ";d=64"
  t0 = time.perf_counter()
  result = run_sweep(SweepOptions(target=os.path.join(folder, "model.py") + ":f",
                                  out=os.path.join(folder, name), grid=grid,
                                  args="x=f32[{b},{d}];w=f32[{d},{2*d}]", report=False,
                                  **kw), Clock())
  total = time.perf_counter() - t0
  if result.ran != _POINTS.value or result.failed:
    raise SystemExit(f"{name}: {result.ran} points ran, {result.failed} failed")
  first = times[0] - t0
  # Steady state: the points after the first `jobs` (start-up excluded).
  steady = (times[-1] - times[_JOBS.value - 1]) / max(1, result.ran - _JOBS.value)
  return {"total": total, "first": first, "per_point": total / result.ran,
          "steady": steady}


def main(argv):
  del argv
  import ray

  with tempfile.TemporaryDirectory() as folder:
    with open(os.path.join(folder, "model.py"), "w") as f:
      f.write(MODEL)
    local = run("local", folder, jobs=_JOBS.value)
    t0 = time.perf_counter()
    ray.init(num_cpus=_JOBS.value, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    started = time.perf_counter() - t0
    try:
      on_ray = run("ray", folder, executor="ray", jobs=None)
    finally:
      ray.shutdown()
  print(f"{_POINTS.value} points, {_JOBS.value} local worker processes vs a local Ray "
        f"cluster of {_JOBS.value} CPUs (ray {ray.__version__}; starting the cluster, "
        f"not counted below: {started:.1f} s)")
  print(f"{'executor':<8} {'total s':>8} {'first point s':>14} {'s/point':>8} "
        f"{'steady s/point':>15}")
  for name, r in (("local", local), ("ray", on_ray)):
    print(f"{name:<8} {r['total']:>8.1f} {r['first']:>14.2f} {r['per_point']:>8.3f} "
          f"{r['steady']:>15.3f}")
  print(f"ray / local: {on_ray['total'] / local['total']:.2f}x in total, "
        f"{on_ray['steady'] / local['steady']:.2f}x per point in steady state; "
        f"Ray adds {1e3 * (on_ray['per_point'] - local['per_point']):+.0f} ms a point "
        f"({1e3 * (on_ray['steady'] - local['steady']):+.0f} ms steady)")


if __name__ == "__main__":
  app.run(main)

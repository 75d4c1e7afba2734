"""What compiling for a GPU target costs: the built-in example's audit for
this machine's CPU against its audit for an H200 (compiled here, no GPU).

Each run is a fresh process (as `hlo-audit example` is), timing the compile
(`capture`) and the analyses (`audit_capture`) apart; runs alternate CPU and
target, and the table gives the best of `--runs` (on a shared machine the
slower runs measure the neighbours) and the median. Needs the plugin wheels
(`pip install -e '.[gpu-target]'`).

Example:
  python scripts/bench_target.py --target=h200 --runs=3
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import app, flags

_TARGET = flags.DEFINE_string("target", "h200", "The GPU to compile for.")
_RUNS = flags.DEFINE_integer("runs", 3, "Runs of each (best and median shown).")
_BACKWARD = flags.DEFINE_bool("backward", True, "The train step (else the forward loss).")

_ONE_RUN = r"""
import json, sys, time
t0 = time.perf_counter()
import jax
import hlo_audit
from hlo_audit import examples
fn, args = examples.example(backward=sys.argv[2] == "1")
t1 = time.perf_counter()
cap = hlo_audit.capture(fn, *args, target=sys.argv[1] or None)
t2 = time.perf_counter()
report = hlo_audit.audit_capture(cap)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "compile": t2 - t1, "analyses": t3 - t2,
                  "kernels": len(report.kernels), "platform": report.module.platform}))
"""


def _run(target: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, "-c", _ONE_RUN, target, "1" if _BACKWARD.value else "0"],
                       env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  runs = {"cpu": [], _TARGET.value: []}
  for _ in range(_RUNS.value):
    runs["cpu"].append(_run(""))
    runs[_TARGET.value].append(_run(_TARGET.value))
  print(f"| example {'train step' if _BACKWARD.value else 'forward'} | kernels | compile "
        "best / median (s) | analyses best / median (s) | total best (s) |")
  print("|---|---:|---:|---:|---:|")
  for name, rs in runs.items():
    comp = [r["compile"] for r in rs]
    ana = [r["analyses"] for r in rs]
    total = min(r["compile"] + r["analyses"] for r in rs)
    print(f"| {name} ({rs[0]['platform']}) | {rs[0]['kernels']} | {min(comp):.2f} / "
          f"{statistics.median(comp):.2f} | {min(ana):.2f} / {statistics.median(ana):.2f} | "
          f"{total:.2f} |")


if __name__ == "__main__":
  app.run(main)

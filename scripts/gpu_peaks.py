r"""Our peak against XLA's footprint for programs compiled for a GPU target.

Compiles the built-in example (forward and train step) and every model of
tests/hlo_audit/real_models for the target on this machine (no GPU needed),
audits each, and prints our peak, XLA's footprint (argument + output + temp
- alias, from `memory_analysis()`) and the gap. Needs
`pip install -e '.[test,gpu-target]'` and JAX_PLATFORMS=cpu.

Usage:
  JAX_PLATFORMS=cpu python scripts/gpu_peaks.py --target=h200
  JAX_PLATFORMS=cpu python scripts/gpu_peaks.py --models=lstm --verbose

Exit codes: 0 every gap within --tolerance, 1 otherwise, 2 bad flags or
missing extras.
"""

from __future__ import annotations

import pathlib
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_TARGET = flags.DEFINE_string("target", "h200", "the GPU to compile for")
_MODELS = flags.DEFINE_list("models", None, "programs to run (default: all)")
_TOLERANCE = flags.DEFINE_float("tolerance", 0.01, "largest accepted relative gap")
_VERBOSE = flags.DEFINE_bool("verbose", False, "print each report's peak line and notes")


def programs():
  """name -> a function of no arguments returning (fn, args)."""
  from hlo_audit import examples
  from tests.hlo_audit.real_models import truth

  out = {"example": lambda: examples.example(backward=True),
         "example_forward": lambda: examples.example(backward=False)}
  for name in truth.MODELS:
    out[name] = truth.model(name).build
  return out


def main(argv) -> int:
  del argv
  import hlo_audit
  try:
    progs = programs()
  except ImportError as e:
    print(f"gpu_peaks: {e} (pip install -e '.[test]')", file=sys.stderr)
    return 2
  names = _MODELS.value or list(progs)
  unknown = sorted(set(names) - set(progs))
  if unknown:
    print(f"gpu_peaks: unknown {unknown}; known: {', '.join(progs)}", file=sys.stderr)
    return 2
  try:
    target = hlo_audit.get_target(_TARGET.value)
  except hlo_audit.TargetError as e:
    print(f"gpu_peaks: {e}", file=sys.stderr)
    return 2
  worst = 0.0
  print(f"{'program':16s} {'ours':>12s} {'XLA':>12s} {'gap':>8s} {'s':>6s}")
  for name in names:
    start = time.perf_counter()
    fn, args = progs[name]()
    r = hlo_audit.audit(fn, *args, target=target)
    gap = (r.peak_bytes - r.xla_peak_bytes) / r.xla_peak_bytes
    worst = max(worst, abs(gap))
    print(f"{name:16s} {r.peak_bytes:12d} {r.xla_peak_bytes:12d} {100 * gap:+7.2f}% "
          f"{time.perf_counter() - start:6.1f}")
    if _VERBOSE.value:
      for n in r.notes:
        print(f"    note: {n}")
  print(f"worst gap {100 * worst:.2f}% (tolerance {100 * _TOLERANCE.value:.0f}%)")
  return 0 if worst <= _TOLERANCE.value else 1


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))

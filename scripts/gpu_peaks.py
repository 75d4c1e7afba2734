r"""Our peak against XLA's footprint for programs compiled for a GPU target.

Compiles the built-in example (forward and train step) and every model of
tests/hlo_audit/real_models for the target on this machine (no GPU needed),
audits each, and prints our peak, XLA's footprint (argument + output + temp
- alias, from `memory_analysis()`) and the gap. Needs
`pip install -e '.[test,gpu-target]'` and JAX_PLATFORMS=cpu.

With --gpus, the example's train step in three sizes, data parallel over
each number of GPUs instead (the batch split, the parameters replicated, the
gradients all-reduced).

Usage:
  JAX_PLATFORMS=cpu python scripts/gpu_peaks.py --target=h200
  JAX_PLATFORMS=cpu python scripts/gpu_peaks.py --models=lstm --verbose
  JAX_PLATFORMS=cpu python scripts/gpu_peaks.py --gpus=2,4,8

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
_GPUS = flags.DEFINE_list("gpus", None, "data parallel over these numbers of GPUs")

#: The example's sizes (`TransformerConfig` fields) the data-parallel runs use.
DATA_PARALLEL_SIZES = {
    "example": dict(batch=8),
    "two_layers": dict(batch=8, layers=2),
    "small": dict(batch=8, seq=64, d_model=128, heads=4, d_ff=512, layers=2, vocab=256),
}


def programs():
  """name -> a function of no arguments returning (fn, args)."""
  from hlo_audit import examples
  from tests.hlo_audit.real_models import truth

  out = {"example": lambda: examples.example(backward=True),
         "example_forward": lambda: examples.example(backward=False)}
  for name in truth.MODELS:
    out[name] = truth.model(name).build
  return out


def data_parallel_programs(target_name: str, counts):
  """name -> a function of no arguments returning (fn, args, target)."""
  import hlo_audit
  from hlo_audit import examples

  def build(sizes, n):
    target = hlo_audit.get_target(target_name, gpus=n)
    fn, args = examples.example(examples.TransformerConfig(**sizes))
    return fn, examples.data_parallel(args, n, target), target

  return {f"{name}_x{n}": (lambda sizes=sizes, n=n: build(sizes, n))
          for name, sizes in DATA_PARALLEL_SIZES.items() for n in counts}


def main(argv) -> int:
  del argv
  import hlo_audit
  try:
    if _GPUS.value:
      progs = data_parallel_programs(_TARGET.value, [int(n) for n in _GPUS.value])
    else:
      progs = {name: (lambda build=build: (*build(), None))
               for name, build in programs().items()}
  except ValueError:
    print(f"gpu_peaks: --gpus takes numbers, got {_GPUS.value}", file=sys.stderr)
    return 2
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
    fn, args, placed = progs[name]()
    r = hlo_audit.audit(fn, *args, target=placed or target)
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

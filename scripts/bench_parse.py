"""Times hlo_audit's HLO parser against XLA's C++ parser on one large module.

Builds the optimized HLO of a 12-layer transformer train step (the built-in
example at larger sizes, forward and backward), then parses the same text with
`hlo_audit.parse_hlo` and with XLA's `ParseAndReturnUnverifiedModule`
(`jaxlib._hlo.hlo_module_from_text`), interleaved, in this one process, and
prints both medians and their ratio (ours / XLA; below 1.0 means faster).
It also times the whole audit of that text (parse and analyses) against the
module's compile time.

Example:
  python scripts/bench_parse.py --layers=12 --repeats=9
  python scripts/bench_parse.py --hlo=/tmp/train_step.hlo   # reuse a module
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

_LAYERS = flags.DEFINE_integer("layers", 12, "Transformer layers of the train step.")
_D_MODEL = flags.DEFINE_integer("d_model", 512, "Model width.")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Timed parses of each parser.")
_HLO = flags.DEFINE_string("hlo", None, "Parse this HLO text file instead of compiling.")
_SAVE = flags.DEFINE_string("save", None, "Write the compiled module's HLO text here.")


def build_module_text(layers: int, d_model: int) -> tuple[str, float]:
  """Optimized HLO text of the train step, and its compile time in seconds."""
  from hlo_audit._src.examples.transformer import TransformerConfig, example

  cfg = TransformerConfig(batch=4, seq=128, d_model=d_model, heads=8,
                          d_ff=4 * d_model, layers=layers, vocab=1000)
  fn, args = example(cfg)
  lowered = fn.lower(*args)
  t0 = time.perf_counter()
  compiled = lowered.compile()
  return compiled.as_text(), time.perf_counter() - t0


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  from jaxlib import _hlo  # XLA's parser, the baseline

  import hlo_audit

  if _HLO.value:
    with open(_HLO.value, encoding="utf-8") as f:
      text = f.read()
    compile_s = None
  else:
    text, compile_s = build_module_text(_LAYERS.value, _D_MODEL.value)
    if _SAVE.value:
      with open(_SAVE.value, "w", encoding="utf-8") as f:
        f.write(text)

  ours, xla = [], []
  module = hlo_audit.parse_hlo(text)  # warm-up (imports, regex compilation)
  _hlo.hlo_module_from_text(text)
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    module = hlo_audit.parse_hlo(text)
    ours.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _hlo.hlo_module_from_text(text)
    xla.append(time.perf_counter() - t0)
  ours_s, xla_s = statistics.median(ours), statistics.median(xla)
  print(f"module: {module.name}: {module.instruction_count} instructions in "
        f"{len(module.computations)} computations, {len(text) / 1e6:.2f} MB of text")
  if compile_s is not None:
    print(f"XLA compile time: {compile_s:.2f} s")
  print(f"hlo_audit.parse_hlo: median {ours_s * 1e3:.1f} ms (min {min(ours) * 1e3:.1f})")
  print(f"XLA C++ parser:      median {xla_s * 1e3:.1f} ms (min {min(xla) * 1e3:.1f})")
  print(f"ratio ours/XLA: {ours_s / xla_s:.2f} (median), "
        f"{min(ours) / min(xla):.2f} (min)")
  audits = []
  for _ in range(3):
    t0 = time.perf_counter()
    report = hlo_audit.audit_hlo(text)
    audits.append(time.perf_counter() - t0)
  audit_s = statistics.median(audits)
  print(f"audit (parse + analyses): median {audit_s:.2f} s; {len(report.kernels)} "
        f"kernels, {len(report.findings)} findings")
  if compile_s is not None:
    print(f"audit / compile time: {audit_s / compile_s:.1%}")


if __name__ == "__main__":
  app.run(main)

"""Captures optimized HLO of the built-in examples as test fixtures.

Compiles the built-in transformer block (forward, and forward+backward) and a
`gelu(x @ w + b)` layer on the default backend with XLA dumping on, and copies
each module's optimized HLO text with XLA's buffer-assignment, live-range and
memory-usage reports into `--out`, plus an `index.json` (date, device, JAX
versions, and our audit's summary of each). On a GPU these are the large
GPU-optimized modules the parser and audit tests need.

Example:
  python scripts/capture_fixtures.py --out=out/fixtures
"""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_OUT = flags.DEFINE_string("out", None, "Folder to write the fixtures to.")
flags.mark_flag_as_required("out")
_TINY = flags.DEFINE_bool("tiny", False, "Small shapes (a CPU dry run of the device check).")


def _cases():
  import jax
  import jax.numpy as jnp

  from hlo_audit.examples import TransformerConfig, example

  def gelu_layer(x, w, b):
    return jax.nn.gelu(x @ w + b, approximate=False)

  s = jax.ShapeDtypeStruct
  d = 256 if _TINY.value else 4096
  yield "gelu_layer", jax.jit(gelu_layer), (
      s((d, d), jnp.bfloat16), s((d, d), jnp.bfloat16), s((d,), jnp.bfloat16))
  for dtype in ("float32", "bfloat16"):
    cfg = (TransformerConfig(dtype=dtype, batch=1, seq=32, d_model=64, d_ff=128, vocab=64)
           if _TINY.value else TransformerConfig(dtype=dtype))
    for backward in (False, True):
      fn, args = example(cfg, backward=backward)
      yield f"transformer_{dtype}_{'train' if backward else 'fwd'}", fn, args


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  import jax

  import hlo_audit

  out = pathlib.Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  index = {"date": datetime.date.today().isoformat(),
           "device": jax.devices()[0].device_kind,
           "platform": jax.default_backend(), "jax": jax.__version__,
           "modules": {}}
  for name, fn, args in _cases():
    tmp = tempfile.mkdtemp(prefix="fixture_")
    try:
      fn.lower(*args).compile(compiler_options={"xla_dump_to": tmp})
      m = hlo_audit.load_dump(tmp).select()  # the largest optimized module
      files = {}
      # Named as XLA names them, so load_dump(<name>.txt) finds the reports.
      for kind, src in (("hlo", m.text_path),
                        ("-buffer-assignment", m.buffer_assignment_path),
                        ("-live-range", m.live_range_path),
                        ("-memory-usage-report", m.memory_usage_report_path)):
        if src:
          dst = out / (f"{name}.txt" if kind == "hlo" else f"{name}{kind}.txt")
          shutil.copyfile(src, dst)
          files[kind] = dst.name
      report = hlo_audit.audit_hlo(str(out / files["hlo"]))
      index["modules"][name] = {
          "stage": m.stage, "files": files,
          "instructions": report.module.instruction_count,
          "kernels_by_kind": dict(report.kernels_by_kind()),
          "findings": len(report.findings), "peak_bytes": report.peak_bytes,
          "xla_peak_bytes": report.xla_peak_bytes}
      print(f"{name}: {m.stage}, {report.module.instruction_count} instructions, "
            f"{len(report.kernels)} kernels, {len(report.findings)} findings")
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  (out / "index.json").write_text(json.dumps(index, indent=2))


if __name__ == "__main__":
  app.run(main)

"""Prediction vs measured: what-if replays held against the changed programs.

For each change, the audit of the original program predicts the peak with
`report.what_if(...)`; the changed program is then compiled and its peak
measured (XLA's footprint: its allocations plus its temp buffer). Prints a
Markdown table; exits 1 when a prediction is off by more than 5%.

Rows: donation of a small train step and of the built-in example (one device
and data parallel on 4 host devices), and with --swap the fusions
`pallas_kernels.swap` performs on the built-in example. On a GPU the swapped
program runs compiled kernels and the row is judged; on CPU the kernels run in
interpret mode, as loops whose carried state XLA copies and pads, so that
program measures the interpreter, not the fusion: the row is shown (with the
interpreted kernels' internal buffers taken out) but not judged.

Usage:
  python scripts/what_if_check.py [--swap]
"""

from __future__ import annotations

import os
import pathlib
import sys

# Host devices for the data-parallel rows, before JAX starts.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]).strip()
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import hlo_audit  # noqa: E402
from hlo_audit._src.cli.example_cmd import data_parallel  # noqa: E402
from hlo_audit._src.examples import transformer  # noqa: E402

TOLERANCE = 0.05


def _step(params, opt, x):
  def loss(params, x):
    h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
    return jnp.sum(h @ params["out"]["kernel"])
  g = jax.grad(loss)(params, x)
  new_opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, g)
  return jax.tree.map(lambda p, m: p - 0.01 * m, params, new_opt), new_opt


def _donation_rows():
  S = jax.ShapeDtypeStruct
  params = {"dense": {"kernel": S((512, 512), jnp.float32), "bias": S((512,), jnp.float32)},
            "out": {"kernel": S((512, 256), jnp.float32)}}
  x = S((64, 512), jnp.float32)
  yield ("MLP train step, donate_argnums=(0, 1)",
         hlo_audit.audit(jax.jit(_step), params, params, x), {"donate": [0, 1]},
         hlo_audit.audit(jax.jit(_step, donate_argnums=(0, 1)), params, params, x), 0)
  fn, args = transformer.example()
  donated = jax.jit(transformer.train_step, static_argnums=(2,), donate_argnums=(0,))
  yield ("example train_step, donate_argnums=(0,)", hlo_audit.audit(fn, *args),
         {"donate": [0]}, hlo_audit.audit(donated, *args), 0)
  dp = data_parallel(args, 4)
  yield ("example train_step on 4 devices (data parallel), donate_argnums=(0,)",
         hlo_audit.audit(fn, *dp), {"donate": [0]}, hlo_audit.audit(donated, *dp), 0)


def _swap_row():
  import pallas_kernels
  from hlo_audit._src.cli.swap_cmd import _concrete_args, swapped_example

  fn, args = transformer.example()
  cfg = args[2]
  params, tokens = _concrete_args(cfg)
  baseline, swapped, _ = swapped_example(fn, cfg)
  result = pallas_kernels.verify(baseline, swapped, params, tokens)
  before, after = result.before, result.after
  gone = [f for f in result.diff.findings_removed if f.boundary and f.kind.slug in (
      "unfused-epilogue", "unfused-prologue", "separate-reduction")]
  live = set(after.live_at_peak)
  internal = sum(b.bytes for b in after.buffers if b.internal and b.name in live)
  interpreted = jax.default_backend() != "gpu"
  return (f"example swap: {len(gone)} fusions pallas_kernels.swap performs"
          + (" (interpret mode: not judged)" if interpreted else ""),
          before, {"fuse": gone}, after, internal)


def main(argv: list[str]) -> int:
  rows = list(_donation_rows())
  if "--swap" in argv:
    rows.append(_swap_row())
  print("| change | original peak | predicted | measured (XLA) | error | measured less "
        "interpreted kernels' internals | error |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  worst = 0.0
  for name, before, change, after, internal in rows:
    w = before.what_if(**change)
    measured = after.xla_peak_bytes or after.peak_bytes
    err = (w.peak_bytes - measured) / measured
    net = measured - internal
    err_net = (w.peak_bytes - net) / net
    if "not judged" not in name:
      # Interpret mode runs each kernel as a loop whose carried state XLA
      # copies: that program is no measure of what the fusion does.
      worst = max(worst, abs(err_net))
    print(f"| {name} | {before.peak_bytes:,} | {w.peak_bytes:,} | {measured:,} | "
          f"{100 * err:+.2f}% | {net:,} | {100 * err_net:+.2f}% |")
  print(f"\nworst error {100 * worst:.2f}% (tolerance {100 * TOLERANCE:.0f}%)")
  return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

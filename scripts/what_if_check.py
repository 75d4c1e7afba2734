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

With --target NAME (h200, h100, b200, ...: `hlo-audit targets`) every
program is XLA's for that GPU, compiled on this machine (pip install
'hlo-audit[gpu-target]'); the data-parallel row uses four of them. The swap
row is judged there only when the swapped program holds compiled kernels.

Usage:
  python scripts/what_if_check.py [--swap] [--target=h200]
"""

from __future__ import annotations

import os
import pathlib
import sys

# Host devices for the data-parallel rows, before JAX starts; with --target,
# the CUDA plugin starts without a GPU on the CPU platform only.
if any(a.startswith("--target") for a in sys.argv[1:]):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]).strip()
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import hlo_audit  # noqa: E402
from hlo_audit import examples  # noqa: E402

TOLERANCE = 0.05


def _step(params, opt, x):
  def loss(params, x):
    h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
    return jnp.sum(h @ params["out"]["kernel"])
  g = jax.grad(loss)(params, x)
  new_opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, g)
  return jax.tree.map(lambda p, m: p - 0.01 * m, params, new_opt), new_opt


def _donation_rows(target=None):
  S = jax.ShapeDtypeStruct
  params = {"dense": {"kernel": S((512, 512), jnp.float32), "bias": S((512,), jnp.float32)},
            "out": {"kernel": S((512, 256), jnp.float32)}}
  x = S((64, 512), jnp.float32)
  on = f" on {target.label}" if target is not None else ""
  yield (f"MLP train step{on}, donate_argnums=(0, 1)",
         hlo_audit.audit(jax.jit(_step), params, params, x, target=target), {"donate": [0, 1]},
         hlo_audit.audit(jax.jit(_step, donate_argnums=(0, 1)), params, params, x,
                         target=target), 0)
  fn, args = examples.example()
  donated = jax.jit(examples.train_step, static_argnums=(2,), donate_argnums=(0,))
  yield (f"example train_step{on}, donate_argnums=(0,)",
         hlo_audit.audit(fn, *args, target=target),
         {"donate": [0]}, hlo_audit.audit(donated, *args, target=target), 0)
  four = hlo_audit.get_target(target, gpus=4) if target is not None else None
  dp = examples.data_parallel(args, 4, four)
  yield (f"example train_step on 4 {'GPUs' if four else 'devices'} (data parallel), "
         "donate_argnums=(0,)", hlo_audit.audit(fn, *dp, target=four), {"donate": [0]},
         hlo_audit.audit(donated, *dp, target=four), 0)


def _swap_row(target=None):
  import functools

  import pallas_kernels

  fn, args = examples.example()
  cfg = args[2]
  params = examples.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.batch, cfg.seq), 0, cfg.vocab)
  # The step differentiates inside, and swap must see the forward program:
  # the swapped step is value_and_grad(swap(loss_fn)) and the example's update.
  loss = pallas_kernels.swap(functools.partial(examples.loss_fn, cfg=cfg))

  def swapped(params, tokens, lr: float = 1e-3):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    return value, jax.tree.map(
        lambda p, g: (p - lr * g.astype("float32")).astype(p.dtype), params, grads)

  options = {"target": target} if target is not None else {}
  result = pallas_kernels.verify(functools.partial(examples.train_step, cfg=cfg), swapped,
                                 params, tokens, **options)
  before, after = result.before, result.after
  gone = [f for f in result.diff.findings_removed if f.boundary and f.kind.slug in (
      "unfused-epilogue", "unfused-prologue", "separate-reduction")]
  live = set(after.live_at_peak)
  internal = sum(b.bytes for b in after.buffers if b.internal and b.name in live)
  if target is not None:
    # Judged only where the swapped ops compiled for the target (custom
    # calls), not where XLA got them as interpret-mode loops.
    compiled = any(k.kind is hlo_audit.KernelKind.PALLAS and k.opcode == "custom-call"
                   for k in after.kernels)
    interpreted = bool(loss.report(params, tokens).replaced) and not compiled
  else:
    interpreted = jax.default_backend() != "gpu"
  return (f"example swap: {len(gone)} fusions pallas_kernels.swap performs"
          + (f" on {target.label}" if target is not None else "")
          + (" (interpret mode: not judged)" if interpreted else ""),
          before, {"fuse": gone}, after, internal)


def _target(argv: list[str]):
  for i, a in enumerate(argv):
    if a.startswith("--target="):
      return hlo_audit.get_target(a.split("=", 1)[1])
    if a == "--target" and i + 1 < len(argv):
      return hlo_audit.get_target(argv[i + 1])
  return None


def main(argv: list[str]) -> int:
  target = _target(argv)
  rows = list(_donation_rows(target))
  if "--swap" in argv:
    rows.append(_swap_row(target))
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

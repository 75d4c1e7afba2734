"""Eight programs, written the way flax, equinox and optax users write them,
audited for TPUs this machine does not have: the HBM peak against XLA:TPU's
footprint, the step estimate against libtpu's `optimal_seconds`, and the
spread of XLA:TPU's per-kernel `estimated_cycles` around ours.

    JAX_PLATFORMS=cpu python scripts/bench_tpu_target.py [--json out.json] [NAME...]

Needs libtpu (`pip install -e '.[tpu-target]'`). Each row is one compile
(seconds on a CPU) in a process of its own; nothing runs. Exits 1 when a
peak is off by more than 1%, an estimate falls outside 0.67-1.5x of
libtpu's, or a compile fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

import hlo_audit

PEAK_TOLERANCE = 0.01
ESTIMATE_RANGE = (0.67, 1.5)


def _sds(x, sharding):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _placed(target, tree, spec=None):
  """`tree`'s arrays as ShapeDtypeStructs on `target`: split along the mesh's
  'data' axis where `spec` says so, replicated otherwise."""
  from jax.sharding import NamedSharding, PartitionSpec
  mesh = target.mesh()
  sharding = NamedSharding(mesh, spec if spec is not None else PartitionSpec())
  return jax.tree.map(lambda x: _sds(x, sharding), tree)


def _classifier_loss(model, x, labels):
  import optax
  return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()


def _nnx_step(model, tx, loss_of):
  """A jitted nnx train step the functional way the nnx docs show (split
  outside, merge inside): `loss_of(model, x, y)`, `tx` an optax optimizer."""
  from flax import nnx

  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, opt))

  @jax.jit
  def step(state, x, y):
    model, opt = nnx.merge(graphdef, state)
    grads = nnx.grad(lambda m: loss_of(m, x, y))(model)
    opt.update(model, grads)
    return nnx.state((model, opt))

  return step, state


# ------------------------------------------------------------ programs ----


def nnx_mlp_adamw(target):
  """flax.nnx MLP trained by nnx.Optimizer(adamw), one v5e chip."""
  import optax
  from flax import nnx

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(1024, 4096, rngs=rngs)
      self.l2 = nnx.Linear(4096, 4096, rngs=rngs)
      self.l3 = nnx.Linear(4096, 1024, rngs=rngs)

    def __call__(self, x):
      return self.l3(nnx.gelu(self.l2(nnx.gelu(self.l1(x)))))

  step, state = _nnx_step(MLP(nnx.Rngs(0)), optax.adamw(1e-3),
                          lambda m, x, y: jnp.mean((m(x) - y) ** 2))
  x = jnp.zeros((512, 1024), jnp.float32)
  return step, (state, x, x)


def linen_decoder_dp(target):
  """flax.linen decoder LM, the batch split over the slice's chips."""
  import flax.linen as nn
  import optax
  from jax.sharding import PartitionSpec

  vocab, dim, heads, seq, batch = 8192, 512, 8, 256, 16

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.LayerNorm()(x)
      h = nn.SelfAttention(num_heads=heads, deterministic=True)(
          h, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
      x = x + h
      h = nn.Dense(4 * dim)(nn.LayerNorm()(x))
      return x + nn.Dense(dim)(nn.gelu(h))

  class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      embed = nn.Embed(vocab, dim)
      x = embed(tokens)
      for _ in range(2):
        x = Block()(x)
      return embed.attend(nn.LayerNorm()(x))

  model = LM()
  tokens = jnp.zeros((batch, seq), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)
  tx = optax.adam(1e-3)
  opt_state = jax.eval_shape(tx.init, params)

  @jax.jit
  def step(params, opt_state, tokens):
    def loss(p):
      logits = model.apply(p, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step, (_placed(target, params), _placed(target, opt_state),
                _placed(target, tokens, PartitionSpec("data")))


def equinox_cnn_dp(target):
  """An equinox CNN trained with optax, the batch split over the chips."""
  import equinox as eqx
  import optax
  from jax.sharding import PartitionSpec

  keys = jax.random.split(jax.random.key(0), 4)
  model = eqx.nn.Sequential([
      eqx.nn.Conv2d(3, 64, 3, padding=1, key=keys[0]), eqx.nn.Lambda(jax.nn.relu),
      eqx.nn.Conv2d(64, 128, 3, padding=1, stride=2, key=keys[1]),
      eqx.nn.Lambda(jax.nn.relu),
      eqx.nn.Conv2d(128, 256, 3, padding=1, stride=2, key=keys[2]),
      eqx.nn.Lambda(jax.nn.relu),
      eqx.nn.Lambda(lambda x: jnp.mean(x, axis=(1, 2))),
      eqx.nn.Linear(256, 10, key=keys[3]),
  ])
  params, static = eqx.partition(model, eqx.is_array)
  tx = optax.sgd(1e-2, momentum=0.9)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, x, y):
    def loss(p):
      m = eqx.combine(p, static)
      logits = jax.vmap(m)(x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  x = jnp.zeros((128, 3, 64, 64), jnp.float32)
  y = jnp.zeros((128,), jnp.int32)
  return step, (_placed(target, params), _placed(target, opt_state),
                _placed(target, x, PartitionSpec("data")),
                _placed(target, y, PartitionSpec("data")))


def nnx_conv_batchnorm(target):
  """flax.nnx conv + BatchNorm classifier, one v6e chip."""
  import optax
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.c1 = nnx.Conv(3, 64, (3, 3), rngs=rngs)
      self.b1 = nnx.BatchNorm(64, rngs=rngs)
      self.c2 = nnx.Conv(64, 128, (3, 3), strides=2, rngs=rngs)
      self.b2 = nnx.BatchNorm(128, rngs=rngs)
      self.head = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
      x = nnx.relu(self.b1(self.c1(x)))
      x = nnx.relu(self.b2(self.c2(x)))
      return self.head(x.mean(axis=(1, 2)))

  step, state = _nnx_step(Net(nnx.Rngs(0)), optax.sgd(1e-2), _classifier_loss)
  return step, (state, jnp.zeros((64, 64, 64, 3)), jnp.zeros((64,), jnp.int32))


def attention_dp(target):
  """jax.nn.dot_product_attention forward and backward, the batch split."""
  from jax.sharding import PartitionSpec

  b, t, h, d = 16, 1024, 8, 64

  @jax.jit
  def step(q, k, v):
    def loss(q, k, v):
      return jax.nn.dot_product_attention(q, k, v, is_causal=True).astype(
          jnp.float32).sum()
    return jax.grad(loss, (0, 1, 2))(q, k, v)

  x = jnp.zeros((b, t, h, d), jnp.bfloat16)
  placed = _placed(target, x, PartitionSpec("data"))
  return step, (placed, placed, placed)


def nnx_vit_dp(target):
  """The suite's flax.nnx ViT (adamw), wider, the batch split over v4 cores."""
  import optax
  from flax import nnx
  from jax.sharding import PartitionSpec

  dim, heads, patches, patch_dim, classes, batch = 384, 6, 64, 768, 100, 64

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.n1 = nnx.LayerNorm(dim, rngs=rngs)
      self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False,
                                         rngs=rngs)
      self.n2 = nnx.LayerNorm(dim, rngs=rngs)
      self.fc1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
      self.fc2 = nnx.Linear(4 * dim, dim, rngs=rngs)

    def __call__(self, x):
      x = x + self.attn(self.n1(x))
      return x + self.fc2(nnx.gelu(self.fc1(self.n2(x))))

  class ViT(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Linear(patch_dim, dim, rngs=rngs)
      self.blocks = nnx.List([Block(rngs) for _ in range(2)])
      self.norm = nnx.LayerNorm(dim, rngs=rngs)
      self.head = nnx.Linear(dim, classes, rngs=rngs)

    def __call__(self, x):
      x = self.embed(x)
      for blk in self.blocks:
        x = blk(x)
      return self.head(self.norm(x).mean(axis=1))

  step, state = _nnx_step(ViT(nnx.Rngs(0)), optax.adamw(1e-3), _classifier_loss)

  x = jnp.zeros((batch, patches, patch_dim))
  y = jnp.zeros((batch,), jnp.int32)
  return step, (_placed(target, state), _placed(target, x, PartitionSpec("data")),
                _placed(target, y, PartitionSpec("data")))


def builtin_example(target):
  """hlo-audit's built-in example (a pre-norm transformer's train step)."""
  from hlo_audit import examples
  return examples.example(examples.TransformerConfig(layers=2, batch=8))


def ce_head(target):
  """A cross-entropy head as optax writes it: f32 logits [8192, 8192]."""
  import optax

  @jax.jit
  def step(x, w, labels):
    def loss(w):
      logits = (x @ w).astype(jnp.float32)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return jax.value_and_grad(loss)(w)

  return step, (jnp.zeros((8192, 1024), jnp.bfloat16), jnp.zeros((1024, 8192), jnp.bfloat16),
                jnp.zeros((8192,), jnp.int32))


#: name -> (target, program).
PROGRAMS = {
    "nnx_mlp_adamw": ("v5e", nnx_mlp_adamw),
    "linen_decoder_dp": ("v5e:2x2", linen_decoder_dp),
    "equinox_cnn_dp": ("v5p:2x2x1", equinox_cnn_dp),
    "nnx_conv_batchnorm": ("v6e", nnx_conv_batchnorm),
    "attention_dp": ("v6e:2x2", attention_dp),
    "nnx_vit_dp": ("v4:2x2x1", nnx_vit_dp),
    "example": ("v5e", builtin_example),
    "ce_head": ("v5e", ce_head),
}


def row(name: str) -> dict:
  target_name, build = PROGRAMS[name]
  target = hlo_audit.get_target(target_name)
  start = time.perf_counter()
  fn, args = build(target)
  report = hlo_audit.audit(fn, *args, target=target)
  est = report.xla_estimate
  spread = report.cycles_spread
  ratio = report.timing.step_time / est.seconds if est is not None and est.seconds else None
  actionable = [f for f in report.findings if f.verdict.value != "keep"]
  return {
      "program": name, "target": target.label, "devices": target.device_count,
      "peak_bytes": report.peak_bytes, "xla_footprint": report.xla_peak_bytes,
      "peak_ratio": report.peak_bytes / report.xla_peak_bytes if report.xla_peak_bytes else None,
      "step_seconds": report.timing.step_time,
      "libtpu_seconds": est.seconds if est is not None else None,
      "libtpu_reported": est.reported if est is not None else None,
      "uncosted": est.uncosted if est is not None else None,
      "estimate_ratio": ratio,
      "cycles_low": spread.low if spread else None,
      "cycles_high": spread.high if spread else None,
      "findings": len(report.findings), "actionable": len(actionable),
      "classes": sorted({f.kind.value for f in actionable}),
      "seconds": time.perf_counter() - start,
  }


def _isolated(name: str) -> dict:
  """`row(name)` in a child process: libtpu aborts the process on some
  compiles (a stack overflow in XLA:TPU's MigrateInstructionUsers, libtpu
  0.0.42.1, a v6e conv + BatchNorm train step), and the other rows go on."""
  proc = subprocess.run([sys.executable, __file__, "--row", name], capture_output=True,
                        text=True, timeout=900)
  if proc.returncode == 0:
    return json.loads(proc.stdout.strip().splitlines()[-1])
  why = (f"libtpu crashed (signal {-proc.returncode})" if proc.returncode < 0 else
         (proc.stderr.strip().splitlines() or ["failed"])[-1][:120])
  return {"program": name, "target": PROGRAMS[name][0], "error": why}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("names", nargs="*", help=f"programs (default: all): {', '.join(PROGRAMS)}")
  p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
  p.add_argument("--row", metavar="NAME", help=argparse.SUPPRESS)  # one row, as JSON
  args = p.parse_args(argv)
  if args.row:
    print(json.dumps(row(args.row)))
    return 0
  rows = [_isolated(n) for n in (args.names or PROGRAMS)]
  print(f"libtpu {importlib.metadata.version('libtpu')}, jax {jax.__version__}")
  print(f"{'program':20s} {'target':10s} {'peak / XLA':>10s} {'ours':>9s} {'libtpu':>9s} "
        f"{'ratio':>6s} {'cycles 10-90%':>14s} findings (actionable: classes)")
  bad = 0
  for r in rows:
    if "error" in r:
      bad += 1
      print(f"{r['program']:20s} {r['target']:10s} {r['error']}")
      continue
    peak_ok = r["peak_ratio"] is not None and abs(r["peak_ratio"] - 1) <= PEAK_TOLERANCE
    est_ok = (r["estimate_ratio"] is not None
              and ESTIMATE_RANGE[0] <= r["estimate_ratio"] <= ESTIMATE_RANGE[1])
    bad += (not peak_ok) + (not est_ok)
    fmt = lambda s: f"{s * 1e6:8.1f}u" if s is not None else "       -"  # noqa: E731
    cyc = (f"{r['cycles_low']:.2f}-{r['cycles_high']:.2f}x" if r["cycles_low"] is not None
           else "-")
    print(f"{r['program']:20s} {r['target']:10s} "
          f"{r['peak_ratio'] or 0:10.4f}{'' if peak_ok else '!'} {fmt(r['step_seconds'])} "
          f"{fmt(r['libtpu_seconds'])} {r['estimate_ratio'] or 0:6.2f}{'' if est_ok else '!'} "
          f"{cyc:>14s} {r['findings']} ({r['actionable']}: {', '.join(r['classes']) or '-'})")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())

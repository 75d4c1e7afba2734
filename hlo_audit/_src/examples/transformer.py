"""The built-in example: a pre-norm transformer block in plain JAX, forward and
backward (a training step), at sizes chosen by name.

Plain `jax.numpy` on purpose: this is what users write, so its optimized HLO
shows what XLA fuses and what it leaves materialized (matmul epilogues, norm
statistics, softmax, layout copies). Sizes are fields of `TransformerConfig`
so sweeps can vary them by name (`--grid 'batch=1,4;seq=128,512'`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True, slots=True)
class TransformerConfig:
  """Sizes of the example. Every field can be set by name from a sweep grid."""

  batch: int = 4
  seq: int = 128
  d_model: int = 256
  heads: int = 4
  d_ff: int = 1024
  layers: int = 1
  vocab: int = 512
  #: Activation and parameter dtype ("float32" or "bfloat16").
  dtype: str = "float32"

  def __post_init__(self):
    if self.d_model % self.heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if f.name != "dtype" and (not isinstance(v, int) or v < 1):
        raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


def init_params(cfg: TransformerConfig, key: jax.Array) -> dict[str, Any]:
  """Random parameters: embeddings and `cfg.layers` blocks."""
  dt = jnp.dtype(cfg.dtype)
  keys = jax.random.split(key, 6 * cfg.layers + 1)

  def dense(k, n_in, n_out):
    return (jax.random.normal(k, (n_in, n_out), jnp.float32) / math.sqrt(n_in)).astype(dt)

  layers = []
  for i in range(cfg.layers):
    k = keys[6 * i: 6 * i + 6]
    layers.append(dict(
        wq=dense(k[0], cfg.d_model, cfg.d_model), wk=dense(k[1], cfg.d_model, cfg.d_model),
        wv=dense(k[2], cfg.d_model, cfg.d_model), wo=dense(k[3], cfg.d_model, cfg.d_model),
        w1=dense(k[4], cfg.d_model, cfg.d_ff), w2=dense(k[5], cfg.d_ff, cfg.d_model),
        b1=jnp.zeros((cfg.d_ff,), dt), b2=jnp.zeros((cfg.d_model,), dt),
        ln1_g=jnp.ones((cfg.d_model,), dt), ln1_b=jnp.zeros((cfg.d_model,), dt),
        ln2_g=jnp.ones((cfg.d_model,), dt), ln2_b=jnp.zeros((cfg.d_model,), dt)))
  emb = (jax.random.normal(keys[-1], (cfg.vocab, cfg.d_model), jnp.float32) * 0.02).astype(dt)
  return dict(emb=emb, layers=layers)


def layer_norm(x, gamma, beta, eps=1e-6):
  """LayerNorm over the last axis, statistics in float32."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(var + eps)
  return (y * gamma + beta).astype(x.dtype)


def attention(p, x, heads: int):
  """Causal multi-head self-attention."""
  b, s, d = x.shape
  hd = d // heads
  q = (x @ p["wq"]).reshape(b, s, heads, hd)
  k = (x @ p["wk"]).reshape(b, s, heads, hd)
  v = (x @ p["wv"]).reshape(b, s, heads, hd)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
  causal = jnp.tril(jnp.ones((s, s), dtype=bool))
  scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
  probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d)
  return out @ p["wo"]


def mlp(p, x):
  """Dense -> bias -> exact GELU -> dense -> bias."""
  h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
  return h @ p["w2"] + p["b2"]


def block(p, x, heads: int):
  """One pre-norm transformer block with residual connections."""
  x = x + attention(p, layer_norm(x, p["ln1_g"], p["ln1_b"]), heads)
  return x + mlp(p, layer_norm(x, p["ln2_g"], p["ln2_b"]))


def loss_fn(params, tokens, cfg: TransformerConfig):
  """Next-token cross-entropy of a tied-embedding language model."""
  x = params["emb"][tokens]
  for p in params["layers"]:
    x = block(p, x, cfg.heads)
  logits = (x @ params["emb"].T).astype(jnp.float32)
  targets = jnp.roll(tokens, -1, axis=1)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def train_step(params, tokens, cfg: TransformerConfig, lr: float = 1e-3):
  """Loss and one SGD update: forward and backward of every block."""
  loss, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg)
  new = jax.tree.map(lambda p, g: (p - lr * g.astype(jnp.float32)).astype(p.dtype), params, grads)
  return loss, new


def example(cfg: TransformerConfig | None = None, *, backward: bool = True):
  """The example as (jitted function, abstract args): ready for `audit`.

  Args:
    cfg: sizes; the defaults audit in a few seconds on a CPU.
    backward: the training step (forward and backward) if True, else the
      forward loss only.

  Returns:
    `(fn, (params, tokens, cfg))`: `fn` is `train_step` (or `loss_fn`) under
    `jax.jit` with `cfg` static; `params` and `tokens` are
    `jax.ShapeDtypeStruct`s, enough to lower, compile and audit it.
  """
  cfg = cfg or TransformerConfig()
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
  fn = train_step if backward else loss_fn
  jitted = jax.jit(fn, static_argnums=(2,))
  return jitted, (params, tokens, cfg)


def data_parallel(args, n: int, target=None):
  """The example's `(params, tokens, cfg)` for data parallelism over `n`
  devices (this process's first `n`, or a `hlo_audit.Target`'s): the batch
  split over a 'data' mesh axis, the parameters replicated.

  Raises:
    ValueError: when the batch does not divide by `n`.
  """
  from jax.sharding import NamedSharding, PartitionSpec as P

  params, tokens, cfg = args
  if tokens.shape[0] % n:
    raise ValueError(f"the example's batch ({tokens.shape[0]}) must divide by {n}")
  if target is not None:
    mesh = target.mesh((n,), ("data",))
  else:
    # Auto axes: XLA's sharding propagation places the rest, as with jit shardings.
    auto = getattr(jax.sharding, "AxisType", None)
    kw = {"axis_types": (auto.Auto,)} if auto is not None else {}
    mesh = jax.make_mesh((n,), ("data",), devices=jax.devices()[:n], **kw)
  replicated = NamedSharding(mesh, P())
  params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                        params)
  tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype,
                                sharding=NamedSharding(mesh, P("data", None)))
  return params, tokens, cfg

"""Models for the benchmarks, written the way their libraries' examples write
them, compiled here to optimized HLO text (cached on disk between runs).

* `example`: hlo-audit's built-in transformer train step (plain JAX).
* `flax`: a Flax linen decoder-only LM and its train step (`TrainState`,
  optax AdamW, `jax.value_and_grad`), as in flax/examples/lm1b.
* `equinox`: an Equinox transformer LM and its train step
  (`eqx.filter_value_and_grad`, optax AdamW), as in the Equinox docs.
* `gpt`: a GPT-2-style causal LM in Flax linen (pre-LayerNorm blocks, tied
  embeddings, dropout-free attention with a causal mask) and its train step
  (optax AdamW with weight decay masked off biases and norms, gradient
  clipping), as nanoGPT's Flax ports write it: held out from the tests.
* Third-party real-model modules from ../shared/hlo_corpus/xla_benchmarks.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "shared", "hlo_corpus", "xla_benchmarks")
#: The largest real-model modules of the corpus (gemma, llama, mixtral).
CORPUS_MODULES = ("gemma3_1b_flax_call__1.hlo", "gemma2_2b_keras_jax__1.hlo",
                  "hlo_gemma4_2b_bf16__1.hlo", "hlo_llama31_8b_bf16_1x8__1.hlo",
                  "hlo_mixtral_8x7b_bf16_1x8__1.hlo")


def example_step(layers: int = 12, d_model: int = 512):
  """(jitted fn, args) of the built-in example's train step."""
  from hlo_audit.examples import TransformerConfig, example
  cfg = TransformerConfig(batch=4, seq=128, d_model=d_model, heads=8,
                          d_ff=4 * d_model, layers=layers, vocab=1000)
  return example(cfg)


def flax_step(layers: int = 12, d_model: int = 256):
  """(jitted fn, args) of a Flax linen LM train step."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from flax.training import train_state

  class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, x):
      d = x.shape[-1]
      x = nn.Dense(self.mlp_dim)(x)
      x = nn.gelu(x)
      return nn.Dense(d)(x)

  class DecoderBlock(nn.Module):
    heads: int
    mlp_dim: int

    @nn.compact
    def __call__(self, x, mask):
      y = nn.LayerNorm()(x)
      y = nn.SelfAttention(num_heads=self.heads)(y, mask=mask)
      x = x + y
      y = nn.LayerNorm()(x)
      return x + MlpBlock(self.mlp_dim)(y)

  class TransformerLM(nn.Module):
    vocab: int
    d_model: int
    layers: int
    heads: int

    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(self.vocab, self.d_model)(tokens)
      pos = self.param("pos_embedding", nn.initializers.normal(0.02),
                       (1, tokens.shape[1], self.d_model))
      x = x + pos
      mask = nn.make_causal_mask(tokens)
      for i in range(self.layers):
        x = DecoderBlock(self.heads, 4 * self.d_model, name=f"block_{i}")(x, mask)
      x = nn.LayerNorm()(x)
      return nn.Dense(self.vocab)(x)

  model = TransformerLM(vocab=1000, d_model=d_model, layers=layers, heads=8)
  tokens = jax.ShapeDtypeStruct((4, 128), jnp.int32)

  def create_state():
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((4, 128), jnp.int32))
    return train_state.TrainState.create(apply_fn=model.apply, params=params,
                                         tx=optax.adamw(1e-3))

  state = jax.eval_shape(create_state)

  def train_step(state, batch):
    def loss_fn(params):
      logits = state.apply_fn(params, batch[:, :-1])
      labels = jax.nn.one_hot(batch[:, 1:], 1000)
      return optax.softmax_cross_entropy(logits, labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  del tokens
  return jax.jit(train_step), (state, jax.ShapeDtypeStruct((4, 129), jnp.int32))


def equinox_step(layers: int = 6, d_model: int = 256):
  """(jitted fn, args) of an Equinox transformer LM train step."""
  import equinox as eqx
  import jax
  import jax.numpy as jnp
  import optax

  class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, d, heads, key):
      k1, k2 = jax.random.split(key)
      self.norm1 = eqx.nn.LayerNorm(d)
      self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
      self.norm2 = eqx.nn.LayerNorm(d)
      self.mlp = eqx.nn.MLP(d, d, 4 * d, depth=1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x, mask):
      y = jax.vmap(self.norm1)(x)
      x = x + self.attn(y, y, y, mask=mask)
      y = jax.vmap(self.norm2)(x)
      return x + jax.vmap(self.mlp)(y)

  class LM(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, vocab, d, n_layers, key):
      keys = jax.random.split(key, n_layers + 2)
      self.embed = eqx.nn.Embedding(vocab, d, key=keys[0])
      self.blocks = [Block(d, 8, k) for k in keys[1:-1]]
      self.norm = eqx.nn.LayerNorm(d)
      self.head = eqx.nn.Linear(d, vocab, key=keys[-1])

    def __call__(self, tokens):
      x = jax.vmap(self.embed)(tokens)
      mask = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), bool))
      for b in self.blocks:
        x = b(x, mask)
      return jax.vmap(self.head)(jax.vmap(self.norm)(x))

  model = LM(1000, d_model, layers, jax.random.PRNGKey(0))
  optim = optax.adamw(1e-3)
  params, static = eqx.partition(model, eqx.is_array)
  opt_state = optim.init(params)

  def train_step(params, opt_state, batch):
    def loss_fn(params):
      model = eqx.combine(params, static)
      logits = jax.vmap(model)(batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
          logits, batch[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optim.update(grads, opt_state, params)
    return eqx.apply_updates(params, updates), opt_state, loss

  abstract = lambda t: jax.tree.map(  # noqa: E731
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t)
  return jax.jit(train_step), (abstract(params), abstract(opt_state),
                               jax.ShapeDtypeStruct((4, 129), jnp.int32))


def gpt_step(layers: int = 12, d_model: int = 384, heads: int = 6, seq: int = 256,
             batch: int = 8, vocab: int = 8192):
  """(jitted fn, args) of a GPT-2-style Flax linen LM train step."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from flax.training import train_state

  class CausalSelfAttention(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
      b, t, c = x.shape
      qkv = nn.Dense(3 * c, name="c_attn")(x)
      q, k, v = jnp.split(qkv, 3, axis=-1)
      split = lambda a: a.reshape(b, t, self.heads, c // self.heads).transpose(0, 2, 1, 3)  # noqa: E731
      q, k, v = split(q), split(k), split(v)
      att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / jnp.sqrt(k.shape[-1]))
      mask = jnp.tril(jnp.ones((t, t), bool))
      att = jnp.where(mask, att, jnp.finfo(att.dtype).min)
      att = jax.nn.softmax(att, axis=-1)
      y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
      return nn.Dense(c, name="c_proj")(y)

  class Block(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
      x = x + CausalSelfAttention(self.heads)(nn.LayerNorm(name="ln_1")(x))
      h = nn.LayerNorm(name="ln_2")(x)
      h = nn.Dense(4 * x.shape[-1], name="c_fc")(h)
      h = nn.gelu(h, approximate=True)
      return x + nn.Dense(x.shape[-1], name="c_proj")(h)

  class GPT(nn.Module):
    vocab: int
    d_model: int
    layers: int
    heads: int
    seq: int

    @nn.compact
    def __call__(self, idx):
      wte = nn.Embed(self.vocab, self.d_model, name="wte")
      wpe = nn.Embed(self.seq, self.d_model, name="wpe")
      x = wte(idx) + wpe(jnp.arange(idx.shape[1])[None])
      for i in range(self.layers):
        x = Block(self.heads, name=f"h_{i}")(x)
      x = nn.LayerNorm(name="ln_f")(x)
      return wte.attend(x)  # tied output embedding

  model = GPT(vocab, d_model, layers, heads, seq)

  def decay_mask(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path[-1].key == "kernel" or path[-1].key == "embedding", params)

  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(6e-4, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay_mask))

  def create_state():
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((batch, seq), jnp.int32))
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

  state = jax.eval_shape(create_state)

  def train_step(state, batch_tokens):
    def loss_fn(params):
      logits = state.apply_fn(params, batch_tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
          logits, batch_tokens[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  return jax.jit(train_step), (state, jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32))


BUILDERS: dict[str, Callable] = {
    "example": example_step, "flax": flax_step, "equinox": equinox_step, "gpt": gpt_step}


def compiled_text(kind: str, cache_dir: str | None, **sizes) -> tuple[str, float]:
  """Optimized HLO text of a built model and its compile time in seconds
  (cached in `cache_dir`, keyed by model, sizes and jax version)."""
  import jax
  key = hashlib.sha1(json.dumps([kind, sizes, jax.__version__],
                                sort_keys=True).encode()).hexdigest()[:12]
  path = os.path.join(cache_dir, f"{kind}-{key}.hlo") if cache_dir else None
  if path and os.path.exists(path) and os.path.exists(path + ".json"):
    with open(path, encoding="utf-8") as f, open(path + ".json") as g:
      return f.read(), json.load(g)["compile_s"]
  fn, args = BUILDERS[kind](**sizes)
  lowered = fn.lower(*args)
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  text = compiled.as_text()
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f, open(path + ".json", "w") as g:
      f.write(text)
      json.dump({"compile_s": compile_s}, g)
  return text, compile_s


def corpus_modules() -> list[tuple[str, str]]:
  """(name, path) of the corpus modules present (none when the corpus is absent)."""
  out = []
  for name in CORPUS_MODULES:
    path = os.path.normpath(os.path.join(CORPUS, name))
    if os.path.exists(path):
      out.append((name.removesuffix("__1.hlo"), path))
  return out

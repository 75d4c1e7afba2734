"""Attention chains routed to JAX's fused attention: found however the
einsums order their axes, computed the same, and replaced only where a fused
call runs (cuDNN, or JAX's Pallas kernel), else left to XLA with the reason."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import jax_attention
from pallas_kernels._src.swap import attention
from pallas_kernels._src.swap import program as prog_lib
from pallas_kernels._src.swap import rewrite
from pallas_kernels._src.swap.patterns import Match, Rejection

B, T, S, N, H = 2, 16, 24, 3, 8


def _causal(t, s):
  return jnp.arange(s)[None, :] <= jnp.arange(t)[:, None]


# Spellings of one attention, as libraries write them (all take and return
# the [batch, seq, heads, head_dim] layout unless said).
def flax_style(q, k, v):
  # flax.linen.dot_product_attention_weights / dot_product_attention.
  w = jnp.einsum("...qhd,...khd->...hqk", q / math.sqrt(H), k)
  w = jax.nn.softmax(w, axis=-1)
  return jnp.einsum("...hqk,...khd->...qhd", w, v)


def haiku_style(q, k, v):
  # haiku.MultiHeadAttention: logits scaled after the einsum, then a mask.
  logits = jnp.einsum("...thd,...Thd->...htT", q, k) * (1.0 / math.sqrt(H))
  logits = jnp.where(_causal(q.shape[-3], k.shape[-3]), logits, -1e30)
  w = jax.nn.softmax(logits)
  return jnp.einsum("...htT,...Thd->...thd", w, v)


def heads_major(q, k, v):
  # [B, N, T, H] throughout, q @ k^T and p @ v as matmuls.
  qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
  p = jax.nn.softmax(qt @ jnp.swapaxes(kt, -1, -2) / math.sqrt(H), axis=-1)
  return jnp.swapaxes(p @ vt, 1, 2)


def merged_batch(q, k, v):
  # [B*N, T, H]: one batch axis, as some code reshapes heads into the batch.
  def fold(a):
    return jnp.swapaxes(a, 1, 2).reshape(B * N, a.shape[1], H)
  p = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", fold(q), fold(k)) * 0.25, axis=-1)
  out = jnp.einsum("bqk,bkd->bqd", p, fold(v))
  return jnp.swapaxes(out.reshape(B, N, T, H), 1, 2)


def additive_bias(q, k, v, bias):
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def _args(dtype=jnp.float32, s=S):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, T, N, H), dtype)
  k = jax.random.normal(keys[1], (B, s, N, H), dtype)
  v = jax.random.normal(keys[2], (B, s, N, H), dtype)
  return q, k, v


def _match(fn, *args):
  program = prog_lib.build(jax.make_jaxpr(fn)(*args))
  for node in program.nodes:
    if node.prim == "dot_general":
      return program, attention.match_attention(program, node, set())
  raise AssertionError("no dot")


def _routed(program, match, args):
  """The program run with the chain replaced by the Match's call (JAX's XLA
  implementation of it: the layouts, scale and mask are what is checked)."""
  def emit(read):
    pos = [o.resolve(read) for _, o in match.positional]
    kw = {k: o.resolve(read) for k, o in match.keywords}
    out = attention.attention(*pos, **kw, **dict(match.static), implementation="xla")
    return {match.outputs[0]: out}
  plan = prog_lib.Plan(emit_before={rewrite._emission_point(program, match): [emit]},
                       skip=set(match.consumed), rewritten={})
  (out,) = prog_lib.evaluate(program, plan, args)
  return out


@pytest.mark.parametrize("fn", [flax_style, haiku_style, heads_major, merged_batch])
def test_each_spelling_is_one_chain_computed_the_same(fn):
  args = _args(s=T if fn is haiku_style else S)
  program, match = _match(fn, *args)
  assert isinstance(match, Match) and match.op == "attention", match
  # Both gemms and the softmax are the call's work.
  dots = {n.index for n in program.nodes if n.prim == "dot_general"}
  assert dots <= match.consumed
  np.testing.assert_allclose(_routed(program, match, args), fn(*args), rtol=2e-5, atol=2e-5)


def test_the_call_gets_the_heads_as_heads(monkeypatch):
  # [B, N, T, H] chains reach JAX's attention as [B, T, N, H]: the heads are
  # what cuDNN's head limits and grouped-query layouts read, not a batch of
  # B * N one-head problems.
  seen = []
  call = jax.nn.dot_product_attention

  def spy(q, k, v, *a, **kw):
    seen.append((q.shape, k.shape))
    return call(q, k, v, *a, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  args = _args()
  _routed(*_match(heads_major, *args), args)
  assert seen == [((B, T, N, H), (B, S, N, H))], seen


def test_the_scale_and_the_causal_mask_reach_the_call():
  program, match = _match(haiku_style, *_args(s=T))
  static = dict(match.static)
  assert static["scale"] == pytest.approx(1 / math.sqrt(H))
  assert static["causal"] is True
  # Without a scale in the chain the call must not apply JAX's 1/sqrt(d).
  _, plain = _match(lambda q, k, v: jnp.einsum(
      "bhqk,bkhd->bqhd", jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k)), v),
      *_args())
  assert dict(plain.static)["scale"] == 1.0


def test_an_additive_mask_is_passed_as_the_bias():
  q, k, v = _args()
  bias = jax.random.normal(jax.random.key(4), (1, N, T, S))
  program, match = _match(additive_bias, q, k, v, bias)
  assert [name for name, _ in match.keywords] == ["mask"]
  np.testing.assert_allclose(_routed(program, match, (q, k, v, bias)),
                             additive_bias(q, k, v, bias), rtol=2e-5, atol=2e-5)


def test_a_bottom_right_causal_mask_is_left_to_xla_and_says_why():
  def fn(q, k, v):
    keep = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None] + (S - T)
    s = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k), -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
  program, result = _match(fn, *_args())
  assert isinstance(result, Rejection) and "top-left" in result.reason
  # Said at the first gemm (the report's line), and the chain is left whole
  # to XLA: no other pattern takes either gemm.
  dots = [n.index for n in program.nodes if n.prim == "dot_general"]
  assert result.anchor == dots[0] and set(dots) <= result.consumed


def test_a_gemm_reading_the_probabilities_over_queries_is_no_attention():
  def fn(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
    return jnp.einsum("bhqk,bqhd->bkhd", p, jnp.ones((B, T, N, H)))  # sums queries
  _, result = _match(fn, *_args())
  assert result is None


def _swap_report(fn, args, **kw):
  return pk.swap(fn, **kw).report(*args)


def test_swap_routes_the_chain_on_an_h200_and_leaves_it_to_xla_on_this_cpu():
  # 32 keys: whole Triton blocks, so JAX's Pallas kernel takes it where cuDNN
  # is not installed; cuDNN takes it where it is.
  args = _args(jnp.bfloat16, s=32)
  on_h200 = _swap_report(flax_style, args, target="h200")
  (site,) = [s for s in on_h200.sites if s.kernel == "jax.nn.dot_product_attention"]
  assert site.replaced and site.pattern.startswith("gemm -> softmax -> gemm")
  here = _swap_report(flax_style, args)
  (site,) = [s for s in here.sites if s.kernel == "jax.nn.dot_product_attention"]
  assert not site.replaced and "needs an NVIDIA GPU" in site.reason
  # The softmax alone is still the softmax kernel's where the chain is not.
  assert [s for s in here.sites if s.kernel == "pallas_kernels.softmax" and s.replaced]


def _lowered_for_h200(dtype) -> str:
  return jax.jit(pk.swap(flax_style, target="h200")).trace(*_args(dtype, s=32)).lower(
      lowering_platforms=("cuda",)).as_text()


def test_f32_on_an_h200_goes_to_jaxs_pallas_kernel_not_cudnn():
  lowered = _lowered_for_h200(jnp.float32)
  assert "cudnn" not in lowered and "triton" in lowered


def test_bf16_on_an_h200_goes_to_cudnn_where_this_jax_has_it():
  why = jax_attention.cudnn_available()
  if why:
    pytest.skip(why)
  assert "__cudnn$fmha" in _lowered_for_h200(jnp.bfloat16)

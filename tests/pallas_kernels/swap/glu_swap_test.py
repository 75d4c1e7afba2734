"""A GLU's gate and up projections swapped for one `glu_matmul`: either
factor first, the activation read by probing, and nothing taken that another
reader still needs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk

M, K, F = 8, 32, 64


def _args(dtype=jnp.float32):
  k = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(k[0], (M, K), dtype), jax.random.normal(k[1], (K, F), dtype),
          jax.random.normal(k[2], (K, F), dtype))


def swiglu(x, wg, wu):  # Llama's MLP, as kv_decode and penzai write it
  return jax.nn.silu(x @ wg) * (x @ wu)


def up_first(x, wg, wu):
  return (x @ wu) * jax.nn.gelu(x @ wg, approximate=False)


def bf16_swiglu(x, wg, wu):  # the activation computed in f32, rounded back
  return (jax.nn.silu((x @ wg).astype(jnp.float32)).astype(x.dtype) * (x @ wu))


@pytest.mark.parametrize("fn, activation, dtype", [
    (swiglu, "silu", jnp.float32), (up_first, "gelu", jnp.float32),
    (bf16_swiglu, "silu", jnp.bfloat16)])
def test_the_pair_is_one_glu_call_with_the_same_values(fn, activation, dtype):
  pk.clear_fallbacks()
  args = _args(dtype)
  swapped = pk.swap(fn, interpret=True)
  (site,) = swapped.report(*args).sites
  assert site.replaced and site.kernel == "pallas_kernels.glu_matmul"
  assert f"activation='{activation}'" in site.call
  got, want = swapped(*args), fn(*args)
  assert got.dtype == want.dtype
  tol = 2e-2 if dtype == jnp.bfloat16 else 1e-4
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             rtol=tol, atol=tol)
  assert not pk.fallbacks()  # the kernel ran (interpreted), no XLA fallback


def test_two_projections_of_different_inputs_are_no_glu():
  def fn(x, y, wg, wu):
    return jax.nn.silu(x @ wg) * (y @ wu)
  x, wg, wu = _args()
  report = pk.swap(fn, interpret=True).report(x, x + 1, wg, wu)
  assert not [s for s in report.sites if s.kernel == "pallas_kernels.glu_matmul"]


def test_a_gate_another_reader_needs_is_left_alone():
  def fn(x, wg, wu):
    g = x @ wg
    return jax.nn.silu(g) * (x @ wu), g.sum()
  report = pk.swap(fn, interpret=True).report(*_args())
  assert not [s for s in report.sites if s.kernel == "pallas_kernels.glu_matmul"]


def test_a_product_another_swap_took_is_no_glu():
  # The finder never takes a node an earlier swap claimed: with the gate's
  # product taken, neither gemm anchors a GLU.
  from pallas_kernels._src.swap import glu, program as program_lib  # pylint: disable=import-outside-toplevel
  prog = program_lib.build(jax.make_jaxpr(swiglu)(*_args()))
  dots = [n for n in prog.nodes if n.prim == "dot_general"]
  (mul,) = [n for n in prog.nodes if n.prim == "mul" and n.outs[0] in prog.returned]
  assert len(dots) == 2
  assert any(glu.match_glu(prog, d, set()) is not None for d in dots)
  assert all(glu.match_glu(prog, d, {mul.index}) is None for d in dots)

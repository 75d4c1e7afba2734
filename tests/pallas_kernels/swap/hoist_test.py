"""Work a scan body repeats at every step from its constants alone, computed
once before the loop by the swap: flax's LSTM under `nn.remat` concatenates
its gate kernels inside the checkpoint, where XLA cannot hoist them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import compat
from pallas_kernels._src.swap.rewrite import HOISTED


def _hoisted(swapped, *args):
  return [s for s in swapped.report(*args).sites if s.kernel == HOISTED]


def _scan_bodies(jaxpr):
  """Every scan body of a jaxpr, nested ones included."""
  for eqn in jaxpr.eqns:
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      if eqn.primitive.name == "scan":
        yield sub
      yield from _scan_bodies(sub)


def _concatenates(jaxpr) -> list[tuple[int, ...]]:
  found = [tuple(e.outvars[0].aval.shape) for e in jaxpr.eqns
           if e.primitive.name == "concatenate"]
  for eqn in jaxpr.eqns:
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _concatenates(sub)
  return found


def test_flaxs_lstm_step_concatenates_its_gate_kernels_once():
  pytest.importorskip("flax")
  from tests.hlo_audit.real_models import model_lstm as m
  fn, args = m.build()
  swapped = pk.swap(fn, interpret=True)
  sites = _hoisted(swapped, *args)
  assert sorted(s.output for s in sites) == sorted(["f32[128,512]", "f32[1,512]", "f32[32,512]"])
  assert all(s.where == "scan body/checkpoint body" and "recurrent.py" in s.source
             for s in sites), sites
  kernels = (m.HIDDEN, 4 * m.HIDDEN)
  before = [c for b in _scan_bodies(jax.make_jaxpr(fn)(*args).jaxpr) for c in _concatenates(b)]
  after = [c for b in _scan_bodies(jax.make_jaxpr(swapped)(*args).jaxpr)
           for c in _concatenates(b)]
  assert kernels in before and kernels not in after
  # The per-step concatenates (the gates' inputs and their gradients) stay.
  assert after == [c for c in before if c[0] == m.BATCH] and after
  got, want = jax.jit(swapped)(*args), fn(*args)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def _scan(body_extra):
  def f(w1, w2, xs):
    def body(h, x):
      return body_extra(w1, w2, h, x), h.sum()
    return jax.lax.scan(body, jnp.zeros((4, 16)), xs)
  return f


_ARGS = (jnp.ones((8, 8)), jnp.full((8, 8), 2.0),
         jax.random.normal(jax.random.key(0), (5, 4, 8)))


def test_a_plain_scan_body_concatenating_its_constants_does_it_once():
  f = _scan(lambda w1, w2, h, x: jnp.tanh(x @ jnp.concatenate([w1, w2], axis=1) + h))
  swapped = pk.swap(f, ops=("softmax",))  # no kernel: the hoist alone
  (site,) = _hoisted(swapped, *_ARGS)
  assert (site.pattern, site.output, site.where) == ("concatenate", "f32[8,16]", "scan body")
  np.testing.assert_allclose(jax.jit(swapped)(*_ARGS)[0], f(*_ARGS)[0], rtol=1e-6)
  # Differentiated through, the hoisted value carries the weights' gradient.
  loss = lambda g: lambda w1, w2: g(w1, w2, _ARGS[2])[0].sum()  # noqa: E731
  got = jax.grad(loss(swapped), argnums=(0, 1))(*_ARGS[:2])
  want = jax.grad(loss(f), argnums=(0, 1))(*_ARGS[:2])
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_work_that_reads_the_carry_views_or_grows_a_constant_stays_in_the_loop():
  # A concatenate with the carry changes every step; a transpose of a weight
  # is folded into its reader by XLA; a pad writes more than it reads.
  carried = _scan(lambda w1, w2, h, x: jnp.concatenate([x @ w1, h[:, :8]], axis=1) + h)
  viewed = _scan(lambda w1, w2, h, x: jnp.tile(x @ w2.T, (1, 2)) + h)
  grown = _scan(lambda w1, w2, h, x: x @ jnp.pad(w1, ((0, 0), (0, 8))) + h)
  # Before the pad, a product of the weights is hoisted; the pad is not.
  (site,) = _hoisted(pk.swap(_scan(lambda w1, w2, h, x: x @ jnp.pad(w1 * w2, ((0, 0), (0, 8)))
                                   + h), ops=("softmax",)), *_ARGS)
  assert (site.pattern, site.output) == ("mul", "f32[8,8]")
  for f in (carried, viewed, grown):
    assert not _hoisted(pk.swap(f, ops=("softmax",)), *_ARGS)
    np.testing.assert_allclose(jax.jit(pk.swap(f, ops=("softmax",)))(*_ARGS)[0],
                               f(*_ARGS)[0], rtol=1e-6)


def test_on_an_h200_the_lstms_loop_invariant_work_is_gone():
  # Both steps compiled for an H200 here and audited: XLA's own program.
  from pallas_kernels._src.audit import topology
  why = topology.unavailable_reason()
  if why:
    pytest.skip(why)
  pytest.importorskip("flax")
  import hlo_audit
  from tests.hlo_audit.real_models import h200_support
  from tests.hlo_audit.real_models import model_lstm as m
  fn, args = m.build()

  def invariant(f) -> int:
    text, _ = h200_support.compile_with_footprint(f, args)
    report = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="h200"))
    return sum(g.bytes_saved for g in report.findings
               if g.kind is hlo_audit.FindingKind.LOOP_INVARIANT)

  before = invariant(fn)
  assert invariant(jax.jit(pk.swap(fn, target="h200"))) == 0
  # jax 0.12's program concatenates the gate kernels in the backward loop
  # (32 steps of 512 KiB); jax 0.11.2's XLA leaves no such work in it.
  if compat.JAX_VERSION >= (0, 12):
    assert before >= 15 << 20


def test_each_hoisted_value_names_only_the_work_that_makes_it():
  # Two values hoisted from one body: the concatenate of the weights reads
  # them straight, not through the product hoisted beside it.
  f = _scan(lambda w1, w2, h, x: jnp.tile(x @ (w1 * 2.0), (1, 2))
            + x @ jnp.concatenate([w1, w2], axis=1) + h)
  sites = _hoisted(pk.swap(f, ops=("softmax",)), *_ARGS)
  assert sorted((s.pattern, s.output) for s in sites) == [
      ("concatenate", "f32[8,16]"), ("mul", "f32[8,8]")]


def test_dead_loop_invariant_work_is_no_value_to_hoist():
  # An invariant product nothing reads (jax keeps it in the scan's body):
  # nothing to hoist, and the swapped program computes what the body does.
  def body(w1, w2, h, x):
    _ = w1 * w2
    return jnp.tanh(x @ w1 + h[:, :8]).repeat(2, axis=1)
  f = _scan(body)
  assert "mul" in str(jax.make_jaxpr(f)(*_ARGS))
  swapped = pk.swap(f, ops=("softmax",))
  assert not _hoisted(swapped, *_ARGS)
  np.testing.assert_allclose(jax.jit(swapped)(*_ARGS)[0], f(*_ARGS)[0], rtol=1e-6)

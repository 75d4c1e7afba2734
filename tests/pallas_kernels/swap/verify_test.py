"""`verify`: the acceptance gate on swapped functions, and interpreted
kernels counted as one kernel each in the audit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
import pallas_kernels
from hlo_audit import FindingKind, KernelKind
from tests.pallas_kernels.swap.conftest import mlp
from tests.pallas_kernels.swap.swap_test import _pallas_calls


@pytest.fixture(scope="module")
def mlp_verification(mlp_args):
  return pallas_kernels.verify(mlp, pallas_kernels.swap(mlp), *mlp_args, grad_argnums=(0, 1))


def test_mlp_passes_every_gate(mlp_verification):
  r = mlp_verification
  assert r.passed and r.verdict == "PASS"
  removed = r.gate("intermediates removed")
  assert removed.status == "pass" and removed.figures.startswith("1/1 targeted findings gone")
  assert r.diff.launches_delta < 0
  assert not r.after.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert r.before.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert "gradients (args [0, 1])" in r.gate("numerics").figures
  timing = r.gate("end-to-end time")
  assert timing.status == "not measured" and "interpret mode" in timing.figures
  text = str(r)
  assert "intermediates removed" in text and text.endswith("verdict: PASS")
  assert r.to_dict()["passed"] is True
  # Sources print as the report prints them: openable from here, not absolute.
  gone = [d for d in removed.details if d.startswith("gone: ")]
  assert gone and all(" at tests/pallas_kernels/swap/conftest.py:" in d for d in gone), gone


def test_numerics_gate_fails_on_wrong_values(mlp_args):
  wrong = lambda x, w, b: mlp(x, w, b) * 1.001
  r = pallas_kernels.verify(mlp, wrong, *mlp_args)
  assert not r.passed and r.gate("numerics").status == "fail"
  assert "FAIL (" in r.verdict and "numerics" in r.verdict


def test_kernels_gate_names_a_fallback(mlp_verification):
  assert mlp_verification.gate("kernels ran").status == "pass"
  x = jax.random.normal(jax.random.key(0), (16, 32), jnp.float32)
  wq = jnp.ones((32, 8), jnp.int8)
  s = jnp.full((2, 8), 0.5, jnp.float32)
  # Groups of 24 rows do not divide K=32: the guard sends the call to XLA.
  f = lambda x, implementation="xla": pallas_kernels.matmul(
      x, wq, w_scale=s, w_group_size=24, implementation=implementation, interpret=True)
  r = pallas_kernels.verify(f, lambda x: f(x, "pallas"), x)
  gate = r.gate("kernels ran")
  assert gate.status == "fail" and "kernels ran" in r.verdict, str(r)
  assert any(d.startswith("pallas_kernels.matmul fell back to XLA: w_group_size 24 does "
                          "not divide K=32") for d in gate.details), gate


def test_verify_needs_concrete_arrays(mlp_args):
  spec = jax.ShapeDtypeStruct((16, 32), jnp.float32)
  with pytest.raises(ValueError, match="concrete arrays"):
    pallas_kernels.verify(mlp, mlp, spec, *mlp_args[1:])


def test_transformer_block_gate(example):
  loss, params, tokens = example
  r = pallas_kernels.verify(loss, pallas_kernels.swap(loss), params, tokens)
  assert r.passed, str(r)
  gone = int(r.gate("intermediates removed").figures.split("/")[0])
  assert gone >= 5
  assert r.diff.launches_delta < 0 and r.diff.materialized_bytes_delta < 0
  kinds = r.after.kernels_by_kind()
  assert 3 <= kinds["pallas kernel"] <= 6  # one-step grids of one op may group


@pytest.mark.parametrize("op", ["matmul", "layer_norm", "softmax"])
def test_interpreted_kernels_are_one_kernel_each_forward_and_backward(op):
  """As many PALLAS kernels as pallas_calls, forward and backward."""
  k = jax.random.split(jax.random.PRNGKey(0), 3)
  if op == "matmul":
    # Multi-step grids: XLA keeps each kernel's loop. (A one-step grid is
    # unrolled; back-to-back unrolled kernels of one op that feed each other
    # then count as one.)
    args = (jax.random.normal(k[0], (512, 256)), jax.random.normal(k[1], (256, 1024)),
            jax.random.normal(k[2], (1024,)))
    fn = lambda x, w, b: pallas_kernels.matmul(x, w, bias=b, activation="gelu",
                                               implementation="pallas", interpret=True)
  elif op == "layer_norm":
    args = (jax.random.normal(k[0], (96, 64)), jnp.ones((64,)), jnp.zeros((64,)))
    fn = lambda x, g, b: pallas_kernels.layer_norm(x, g, b, implementation="pallas",
                                                   interpret=True)
  else:
    args = (jax.random.normal(k[0], (2, 2, 32, 32)),)
    fn = lambda s: pallas_kernels.softmax(s, scale=0.5, causal=True,
                                          implementation="pallas", interpret=True)
  grad = jax.grad(lambda *a: (fn(*a) ** 2).sum(), argnums=tuple(range(len(args))))
  for f in (fn, grad):
    report = hlo_audit.audit(jax.jit(f), *args)
    pallas = [x for x in report.kernels if x.kind is KernelKind.PALLAS]
    assert len(pallas) == _pallas_calls(f, *args)
    assert all(x.detail == f"pallas_kernels.{op} (interpreted)" for x in pallas)
    # The interpreter's loop-state copies are the kernel's, not the user's.
    assert not report.findings_of(FindingKind.STANDALONE_COPY)
    assert not report.findings_of(FindingKind.LAYOUT_CONFLICT)
    assert not [x for x in report.kernels if x.kind is KernelKind.COPY]




def test_judged_peak_counts_interpreted_outputs_from_their_launch():
  """Interpreted kernels' internal buffers are left out at every step, and
  an interpreted kernel's output counts from the kernel's launch (compiled, it
  comes to life then), not from the fill XLA schedules before the loop."""
  import types
  from pallas_kernels._src.audit.verify import peak_without_internal
  buf = lambda name, nbytes, rng, producer, internal=False: types.SimpleNamespace(
      name=name, bytes=nbytes, live_range=rng, producer=producer, internal=internal,
      placement="heap")
  kernel = types.SimpleNamespace(name="while.7", time=2, members=("while.7", "fill"))
  # Base [10, 30, 5, 5]; the kernel's output (25 B, filled at t=0, the kernel
  # launches at t=2) and an internal pad (10 B at t=3) on top.
  report = types.SimpleNamespace(
      timeline=(35, 55, 30, 40), peak_bytes=55, kernels=(kernel,),
      buffers=(buf("out", 25, (0, 3), "while.7"), buf("pad", 10, (3, 3), "while.7", True),
               buf("x", 5, (0, 3), "")))
  assert peak_without_internal(report) == 30


def test_low_precision_numerics_are_judged_against_float32():
  # In bf16 the baseline's own rounding can pass the bound: a candidate no
  # further from the float32 truth passes, one a little further fails.
  from pallas_kernels._src.audit import verify as verify_mod
  truth = np.linspace(1.0, 2.0, 256, dtype=np.float32)
  i = np.arange(256, dtype=np.float32)
  off = lambda e, wave: (truth * (1 + e * wave)).astype(jnp.bfloat16)
  baseline = off(0.03, np.sin(i))  # errors in other places than the candidates'
  better, worse = off(0.024, np.cos(i)), off(0.04, np.cos(i))
  bf16 = [jnp.dtype(jnp.bfloat16)]
  compare = verify_mod._compare  # noqa: SLF001
  _, lines, ok = compare("output", [baseline], [better], bf16, grad=False, truth_tree=[truth])
  assert ok and "no worse: pass" in lines[0]
  _, lines, ok = compare("output", [baseline], [worse], bf16, grad=False, truth_tree=[truth])
  assert not ok and "against float32" in lines[0]
  _, _, ok = compare("output", [baseline], [better], bf16, grad=False)
  assert not ok  # without the truth, only the bound


def test_nothing_to_remove_is_not_a_removal_pass():
  # One elementwise chain XLA fuses whole: no gap for a swap to close, so
  # the removal gate is not measured (and no launch grew).
  def f(x):
    return jnp.tanh(x) * 2.0 + x

  r = pallas_kernels.verify(f, f, jnp.ones((64, 128)))
  removed = r.gate("intermediates removed")
  assert removed.figures.startswith("0/0 targeted findings gone")
  assert removed.status == "not measured", removed

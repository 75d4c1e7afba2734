"""`verify`: the acceptance gate on swapped functions, and interpreted
kernels counted as one kernel each in the audit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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


def test_numerics_gate_fails_on_wrong_values(mlp_args):
  wrong = lambda x, w, b: mlp(x, w, b) * 1.001
  r = pallas_kernels.verify(mlp, wrong, *mlp_args)
  assert not r.passed and r.gate("numerics").status == "fail"
  assert "FAIL (" in r.verdict and "numerics" in r.verdict


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



_FILLS = """HloModule m

fill_comp {
  c = f32[] parameter(0)
  ROOT b = f32[64,128] broadcast(c), dimensions={}
}

ENTRY main {
  x = f32[64,128] parameter(0)
  fillv = f32[] constant(nan)
  merged = f32[64,128] fusion(fillv), kind=kLoop, calls=fill_comp
  loop_copy = f32[64,128] copy(merged)
  named = f32[64,128] fusion(fillv), kind=kLoop, calls=fill_comp, metadata={op_name="jit(f)/pallas_kernels.softmax/softmax_fwd/broadcast_in_dim"}
  users = f32[64,128] broadcast(fillv), dimensions={}, metadata={op_name="jit(f)/broadcast_in_dim"}
  ROOT copy_x = f32[64,128] copy(x)
}
"""


def test_interpreted_kernels_output_fills_are_recognised():
  """Interpret mode fills each kernel's outputs before its loop; XLA merges
  identical fills (dropping their names) and copies them into each loop's
  state. Those are kernel internals (the peak gate leaves them out when only
  interpreted kernels read them); the user's broadcasts and copies are not."""
  from hlo_audit._src.analysis.buffers import _is_kernel_fill
  module = hlo_audit.parse_hlo(_FILLS)
  comp = module.computation("main")
  verdicts = {i.name: _is_kernel_fill(module, comp, i) for i in comp.instructions}
  assert verdicts == {"x": False, "fillv": False, "merged": True, "loop_copy": True,
                      "named": True, "users": False, "copy_x": False}

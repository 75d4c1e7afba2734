"""Lowered for a TPU, an op runs its Mosaic TPU kernel where it has one (the
row ops, the matmul) and XLA's ops where it has none (glu_matmul), recording
why; before, the CPU's interpret-mode build was lowered into the TPU program,
silently."""

from __future__ import annotations

import hlo_audit
import pytest

from tests.tpu_target import require_tpu_target


def _lowered_for_a_v5e(fn, shape):
  import jax
  import jax.numpy as jnp

  from pallas_kernels._src import guard

  device = hlo_audit.get_target("v5e").devices()[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for s in shape]
  with guard.collect_fallbacks() as records:
    text = jax.jit(fn).trace(*args).lower().compile().as_text()
  return text, records


def test_an_op_without_a_tpu_kernel_says_it_falls_back():
  require_tpu_target()
  import pallas_kernels

  text, records = _lowered_for_a_v5e(
      lambda x, wg, wu: pallas_kernels.glu_matmul(x, wg, wu, implementation="pallas"),
      [(128, 256), (256, 256), (256, 256)])
  assert "tpu_custom_call" not in text
  reasons = [f.reason for f in records if f.op == "glu_matmul"]
  assert reasons and all(r.startswith("when lowered for TPU v5 lite: ") for r in reasons)


@pytest.mark.parametrize("op", ["softmax", "matmul"])
def test_an_op_lowered_for_a_tpu_is_its_mosaic_tpu_kernel(op):
  require_tpu_target()
  import pallas_kernels

  if op == "softmax":
    fn, shapes = lambda x: pallas_kernels.softmax(x, implementation="pallas"), [(8, 256)]
  else:
    fn = lambda x, w: pallas_kernels.matmul(x, w, implementation="pallas")
    shapes = [(128, 256), (256, 256)]
  text, records = _lowered_for_a_v5e(fn, shapes)
  assert 'custom_call_target="tpu_custom_call"' in text
  assert not [f for f in records if f.op == op]

"""Until Mosaic TPU kernels land, an op lowered for a TPU runs XLA's ops and
records why (it did so silently before: the CPU's interpret-mode build was
lowered into the TPU program)."""

from __future__ import annotations

import hlo_audit
from tests.tpu_target import require_tpu_target


def test_pallas_kernels_lowered_for_a_tpu_say_they_fall_back():
  require_tpu_target()
  import jax
  import jax.numpy as jnp

  import pallas_kernels
  from pallas_kernels._src import guard

  device = hlo_audit.get_target("v5e").devices()[0]
  x = jax.ShapeDtypeStruct((8, 256), jnp.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  with guard.collect_fallbacks() as records:
    text = jax.jit(lambda a: pallas_kernels.softmax(a, implementation="pallas")).trace(
        x).lower().compile().as_text()
  assert "tpu_custom_call" not in text
  reasons = [f.reason for f in records if f.op == "softmax"]
  assert reasons and all(r.startswith("when lowered for TPU v5 lite: ") for r in reasons)

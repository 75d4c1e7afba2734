"""A donated buffer whose update XLA no longer runs in place: a GQA decode
step's KV cache (model_kv_decode.py) compiled for an H200 is transposed or
copied whole, updated and written back whole every token; a cache XLA
updates in place is no finding."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support


def test_the_decode_steps_cache_updates_are_not_in_place_on_an_h200():
  r = hlo_audit.audit_hlo(h200_support.fixture("kv_decode"))
  lost = {f.evidence.split(" ")[0]: f for f in r.findings_of(FindingKind.LOST_IN_PLACE)}
  assert set(lost) == {"cache['k']", "cache['v']"}, sorted(lost)
  k, v = lost["cache['k']"], lost["cache['v']"]
  # k: transposed whole for the attention gemms, written back transposed.
  assert k.producer == "input_transpose_fusion" and k.consumers == ("wrapped_transpose",)
  assert "relayout" in k.ops and "bf16[2,4,2,32,256]" in k.evidence
  # v: copied whole (its readers read the old values after the update).
  assert v.producer == "loop_transpose_fusion" and v.consumers == ("copy.6",)
  # Each moves the whole 256 KiB cache twice (read and write) in each of two
  # kernels, less the slot the update writes: about 1 MiB per token.
  for f in (k, v):
    assert 1_000_000 < f.bytes_saved < 4 * 262144, f.bytes_saved
    assert f.boundary_shape == "bf16[2,4,256,2,32]"


def test_a_cache_updated_in_place_is_no_finding():
  def step(cache, x, pos):
    cache = jax.lax.dynamic_update_slice(cache, x[None], (pos, 0))
    return cache, cache.sum()

  r = hlo_audit.audit(jax.jit(step, donate_argnums=0), jnp.zeros((256, 64)),
                      jnp.ones((64,)), jnp.int32(3))
  assert r.program.module.input_output_alias  # donated, aliased to the new cache
  assert not r.findings_of(FindingKind.LOST_IN_PLACE)

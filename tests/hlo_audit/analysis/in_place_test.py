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


_EMBEDDING_UPDATE = """HloModule step, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias) }

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%update (p: f32[1024,64], i: s32[32,1], g: f32[32,64]) -> f32[1024,64] {
  %p = f32[1024,64]{1,0} parameter(0)
  %i = s32[32,1]{1,0} parameter(1)
  %g = f32[32,64]{1,0} parameter(2)
  %z = f32[] constant(0)
  %zeros = f32[1024,64]{1,0} broadcast(%z), dimensions={}
  %grad = f32[1024,64]{1,0} scatter(%zeros, %i, %g), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %lr = f32[] constant(0.1)
  %lrb = f32[1024,64]{1,0} broadcast(%lr), dimensions={}
  %step = f32[1024,64]{1,0} multiply(%grad, %lrb)
  ROOT %new = f32[1024,64]{1,0} subtract(%p, %step)
}

ENTRY %main (table: f32[1024,64], ids: s32[32,1], g: f32[32,64]) -> (f32[1024,64]) {
  %table = f32[1024,64]{1,0} parameter(0)
  %ids = s32[32,1]{1,0} parameter(1)
  %g = f32[32,64]{1,0} parameter(2)
  %fusion = f32[1024,64]{1,0} fusion(%table, %ids, %g), kind=kLoop, calls=%update
  ROOT %out = (f32[1024,64]{1,0}) tuple(%fusion)
}
"""


def test_a_scatter_into_another_buffer_is_no_lost_update():
  # An embedding table's SGD step: the kernel writing the donated table holds
  # a scatter-add, but into zeros (the gradient), and the table itself is
  # rewritten whole by the update, as any optimizer step does.
  r = hlo_audit.audit_hlo(_EMBEDDING_UPDATE)
  assert r.program.module.input_output_alias
  assert not r.findings_of(FindingKind.LOST_IN_PLACE)


def _converted_whole() -> str:
  return _EMBEDDING_UPDATE.replace(
      '''  %z = f32[] constant(0)
  %zeros = f32[1024,64]{1,0} broadcast(%z), dimensions={}
  %grad = f32[1024,64]{1,0} scatter(%zeros, %i, %g), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %lr = f32[] constant(0.1)
  %lrb = f32[1024,64]{1,0} broadcast(%lr), dimensions={}
  %step = f32[1024,64]{1,0} multiply(%grad, %lrb)
  ROOT %new = f32[1024,64]{1,0} subtract(%p, %step)''',
      '''  %wide = f64[1024,64]{1,0} convert(%p)
  %row = f64[32,64]{1,0} convert(%g)
  %zero = s32[] constant(0)
  %at = f64[1024,64]{1,0} dynamic-update-slice(%wide, %row, %zero, %zero)
  ROOT %new = f32[1024,64]{1,0} convert(%at)''')


def test_a_cache_converted_whole_around_its_update_is_a_lost_update():
  r = hlo_audit.audit_hlo(_converted_whole())
  (lost,) = r.findings_of(FindingKind.LOST_IN_PLACE)
  assert lost.producer == "fusion" and "f64[32,64]" in lost.evidence


def test_an_update_of_the_whole_buffer_saves_nothing_in_place():
  # The rows written cover the table: written in place or not, the kernel
  # moves the same bytes, so there is nothing to save and no finding.
  text = _converted_whole().replace("f32[32,64]", "f32[1024,64]").replace(
      "f64[32,64]", "f64[1024,64]")
  r = hlo_audit.audit_hlo(text)
  assert not r.findings_of(FindingKind.LOST_IN_PLACE)
  from hlo_audit._src.analysis.detectors import in_place  # pylint: disable=import-outside-toplevel
  assert in_place.find(r.program) == ()  # not a record of 0 bytes, dropped later


# A sparse update of a donated table in place (a scatter-add into the
# table's own buffer), with the rows' hit counts scattered into zeros as a
# second output of the same kernel.
_IN_PLACE_BESIDE_COUNTS = """HloModule step, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias) }

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%update (p: f32[1024,64], i: s32[32,1], g: f32[32,64]) -> (f32[1024,64], f32[1024]) {
  %p = f32[1024,64]{1,0} parameter(0)
  %i = s32[32,1]{1,0} parameter(1)
  %g = f32[32,64]{1,0} parameter(2)
  %new = f32[1024,64]{1,0} scatter(%p, %i, %g), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %z = f32[] constant(0)
  %zeros = f32[1024]{0} broadcast(%z), dimensions={}
  %one = f32[] constant(1)
  %ones = f32[32]{0} broadcast(%one), dimensions={}
  %count = f32[1024]{0} scatter(%zeros, %i, %ones), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  ROOT %t = (f32[1024,64]{1,0}, f32[1024]{0}) tuple(%new, %count)
}

ENTRY %main (table: f32[1024,64], ids: s32[32,1], g: f32[32,64]) -> (f32[1024,64], f32[1024]) {
  %table = f32[1024,64]{1,0} parameter(0)
  %ids = s32[32,1]{1,0} parameter(1)
  %g = f32[32,64]{1,0} parameter(2)
  %fusion = (f32[1024,64]{1,0}, f32[1024]{0}) fusion(%table, %ids, %g), kind=kLoop, calls=%update
  %new = f32[1024,64]{1,0} get-tuple-element(%fusion), index=0
  %count = f32[1024]{0} get-tuple-element(%fusion), index=1
  ROOT %out = (f32[1024,64]{1,0}, f32[1024]{0}) tuple(%new, %count)
}
"""


def test_an_update_in_place_beside_a_scatter_into_zeros_is_no_lost_update():
  # One of the kernel's updates writes the table's own buffer: XLA kept the
  # update in place, whatever else the kernel fills.
  r = hlo_audit.audit_hlo(_IN_PLACE_BESIDE_COUNTS)
  assert r.program.module.input_output_alias
  assert not r.findings_of(FindingKind.LOST_IN_PLACE)

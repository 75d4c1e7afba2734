"""Donation's dataflow without a second walk: `with_output_aliases` must say
exactly what `analyze_dataflow` says of the module with the aliases added,
on programs JAX compiled and on third-party modules of the corpus; and the
liveness tables derived for it what building them afresh gives."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.analysis import liveness
from hlo_audit._src.analysis.dataflow import analyze_dataflow, with_output_aliases
from hlo_audit._src.analysis.donation import donation_aliases, with_donation
from hlo_audit._src.analysis.schedule import flatten_schedule
from tests.hlo_audit.hlo.hlo_corpus import corpus_path

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def adam_like(params, state, x):
  # Two pytrees of the same shapes: each output has two same-typed
  # parameters to alias, so the pairing order matters.
  g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"]) @ p["v"]))(params)
  state = jax.tree.map(lambda m, g: 0.9 * m + g * g, state, g)
  return jax.tree.map(lambda p, m, g: p - g / (jnp.sqrt(m) + 1e-6), params, state, g), state


@functools.cache
def modules():
  params = {"w": S((64, 128), F32), "v": S((128, 64), F32)}
  out = [("adam_like", hlo_audit.capture(jax.jit(adam_like), params, params,
                                         S((32, 64), F32)).module)]
  for name in ("gemma3_1b_flax_call__1",):
    path = corpus_path() / "xla_benchmarks" / f"{name}.hlo"
    if path.exists():
      out.append((name, hlo_audit.parse_hlo(path.read_text(), source=str(path))))
  return out


def check(module, numbers):
  schedule = flatten_schedule(module)
  base = analyze_dataflow(module, schedule)
  pairs = donation_aliases(module, base, numbers)
  assert pairs, "nothing to alias: the test would check nothing"
  donated = with_donation(module, pairs)
  # with_donation hands over its aliases parsed: they must be what its text says.
  reread = dataclasses.replace(donated, attributes=donated.attributes)
  assert donated.input_output_alias == reread.input_output_alias
  assert len(donated.input_output_alias) == len(module.input_output_alias) + len(pairs)
  got = with_output_aliases(base, donated, [(i, n, ()) for i, n in pairs])
  want = analyze_dataflow(donated, schedule)
  assert len(want.buffers) < len(base.buffers)  # the aliases merged buffers
  assert dict(got.buffer_of) == dict(want.buffer_of)
  assert list(got.buffers.items()) == list(want.buffers.items())  # order too
  assert got.values is base.values and got.holds is base.holds
  check_liveness(module, schedule, base, donated, got, want)


def check_liveness(module, schedule, base, donated, got, want):
  """The donated program's liveness tables, derived from the audited
  program's (what a donation replay does), are the ones built afresh; so is
  its liveness."""
  cache: dict = {}
  liveness.analyze_liveness(module, schedule, base, cache=cache)
  audited = cache["liveness_tables"]
  assert audited.extends_to(donated, schedule, got)  # else nothing is derived
  derived = liveness._Tables(donated, schedule, got, audited)
  fresh = liveness._Tables(donated, schedule, want)
  for field in ("value_ranges", "parameter_buffers", "output_buffers", "sizes",
                "order", "position"):
    assert getattr(derived, field) == getattr(fresh, field), field
  assert derived.parameter_buffers < audited.parameter_buffers  # donation freed some
  replayed = liveness.analyze_liveness(donated, schedule, got, cache=cache)
  assert cache["liveness_tables"] is audited  # the audited tables stay cached
  afresh = liveness.analyze_liveness(donated, schedule, want)
  assert replayed == afresh


@pytest.mark.parametrize("which", ["all", "odd"])
def test_aliases_merge_buffers_as_the_full_analysis_does(which):
  for name, module in modules():
    numbers = [p.parameter_number for p in module.entry.parameters]
    if which == "odd":
      numbers = numbers[1::2]
    check(module, numbers)


def test_no_alias_returns_the_dataflow_itself():
  _, module = modules()[0]
  base = analyze_dataflow(module, flatten_schedule(module))
  assert with_output_aliases(base, module, []) is base


# Hand-written HLO may call one computation from two places (XLA's optimized
# modules clone it instead). The schedule runs %f once, at its first caller
# %c1, after %t0: %f's parameter holds %t0's elements, not %g's parameter's,
# which the schedule has not reached yet.
CALLED_TWICE = """
HloModule twice, is_scheduled=true
%f (p: (f32[8], f32[8])) -> (f32[8], f32[8]) {
  %p = (f32[8]{0}, f32[8]{0}) parameter(0)
  %a = f32[8]{0} get-tuple-element(%p), index=0
  %b = f32[8]{0} get-tuple-element(%p), index=1
  %c = f32[8]{0} add(%a, %b)
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%c, %a)
}
%g (q: (f32[8], f32[8])) -> (f32[8], f32[8]) {
  %q = (f32[8]{0}, f32[8]{0}) parameter(0)
  ROOT %r = (f32[8]{0}, f32[8]{0}) call(%q), to_apply=%f
}
ENTRY %main (x: f32[8], y: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %y = f32[8]{0} parameter(1)
  %t0 = (f32[8]{0}, f32[8]{0}) tuple(%x, %y)
  %c1 = (f32[8]{0}, f32[8]{0}) call(%t0), to_apply=%f
  %c2 = (f32[8]{0}, f32[8]{0}) call(%c1), to_apply=%g
  ROOT %o = f32[8]{0} get-tuple-element(%c2), index=0
}
"""


def test_a_computation_called_twice_takes_its_parameters_from_its_first_caller():
  from hlo_audit._src.analysis.tuple_tables import tuple_tables
  module = hlo_audit.parse_hlo(CALLED_TWICE)
  schedule = flatten_schedule(module)
  assert schedule.time["c1"] < schedule.time["r"]
  flow = analyze_dataflow(module, schedule)
  assert flow.buffer_of[("p", (0,))] == flow.buffer_of[("x", ())]
  assert flow.buffer_of[("p", (1,))] == flow.buffer_of[("y", ())]
  # The pointer table of %f's parameter is %t0's, handed in by %c1.
  comps = {name: module.computation(name) for name in schedule.span}
  tables = {t.value: t.buffer for t in tuple_tables(module, schedule, comps, {})}
  assert tables[("p", ())] == tables[("t0", ())]


# XLA:GPU's asynchronous all-reduce in the three forms its start takes: the
# result (an array), a combined all-reduce's tuple of results, and
# ((operands), result) as XLA:GPU prints it since jax 0.12. Each done is the
# start's result buffer.
ASYNC_ALL_REDUCE = """
HloModule ar, is_scheduled=true
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main (x: f32[8], y: f32[4]) -> (f32[8], f32[8], f32[4], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %y = f32[4]{0} parameter(1)
  %n = f32[8]{0} negate(%x)
  %ars = f32[8]{0} all-reduce-start(%n), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  %m = f32[4]{0} negate(%y)
  %tup = (f32[8]{0}, f32[4]{0}) all-reduce-start(%n, %m), channel_id=2, replica_groups={{0,1}}, to_apply=%add
  %tud = (f32[8]{0}, f32[4]{0}) all-reduce-done(%tup)
  %t0 = f32[8]{0} get-tuple-element(%tud), index=0
  %t1 = f32[4]{0} get-tuple-element(%tud), index=1
  %new = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%n), channel_id=3, replica_groups={{0,1}}, to_apply=%add
  %newd = f32[8]{0} all-reduce-done(%new)
  ROOT %r = (f32[8]{0}, f32[8]{0}, f32[4]{0}, f32[8]{0}) tuple(%ard, %t0, %t1, %newd)
}
"""


def test_an_all_reduce_done_is_its_starts_result_buffer():
  module = hlo_audit.parse_hlo(ASYNC_ALL_REDUCE)
  flow = analyze_dataflow(module, flatten_schedule(module))
  # A done defines no value: it hands on its start's, element by element.
  for done in ("ard", "tud", "newd"):
    assert not [v for v in flow.values if v[0] == done]
  assert flow.values_of("r") == (("ars", ()), ("tup", (0,)), ("tup", (1,)), ("new", (1,)))


# The other async starts hold their operands too, each as XLA's dataflow
# reads it: an all-gather's (operand, result), a permute's (operand,
# result, contexts), a copy's (destination, operand, context).
ASYNC_STARTS = """
HloModule starts, is_scheduled=true
ENTRY %main (x: f32[8]) -> (f32[32], f32[8], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %n = f32[8]{0} negate(%x)
  %ags = (f32[8]{0}, f32[32]{0}) all-gather-start(%n), replica_groups={{0,1,2,3}}, dimensions={0}
  %agd = f32[32]{0} all-gather-done(%ags)
  %cps = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%n), source_target_pairs={{0,1},{1,0}}
  %cpd = f32[8]{0} collective-permute-done(%cps)
  %cs = (f32[8]{0}, f32[8]{0}, u32[]) copy-start(%n)
  %cd = f32[8]{0} copy-done(%cs)
  ROOT %r = (f32[32]{0}, f32[8]{0}, f32[8]{0}) tuple(%agd, %cpd, %cd)
}
"""


def test_async_starts_hold_their_operands_until_the_done():
  module = hlo_audit.parse_hlo(ASYNC_STARTS)
  flow = analyze_dataflow(module, flatten_schedule(module))
  assert dict(flow.holds["ags"]) == {(0,): ("n", ()), (1,): ("ags", (1,))}
  assert dict(flow.holds["cps"]) == {(0,): ("n", ()), (1,): ("cps", (1,)),
                                     (2,): ("cps", (2,)), (3,): ("cps", (3,))}
  assert dict(flow.holds["cs"]) == {(0,): ("cs", (0,)), (1,): ("n", ()), (2,): ("cs", (2,))}
  assert flow.values_of("r") == (("ags", (1,)), ("cps", (1,)), ("cs", (0,)))
  # The operand is read until each done: its uses name the dones.
  readers = {user for user, _ in flow.uses[("n", ())]}
  assert {"agd", "cpd", "cd"} <= readers

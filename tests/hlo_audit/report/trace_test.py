"""The estimated timeline as a Chrome trace: one complete event per launch on
named threads, durations that add up to the step, folded loops and findings
in the args, strict JSON, and one clear error without an estimate."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.analysis.time_model import KernelTime, Launch, StepTime
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.examples.transformer import TransformerConfig, example
from hlo_audit._src.report import trace
from hlo_audit._src.report.json_report import report_from_dict

#: Two asynchronous all-gathers: the first exposed, the second hidden under
#: a kernel, so the step has communication on a track of its own.
GATHERS = """
HloModule async_gathers, is_scheduled=true, num_partitions=4

%neg_f {
  %p = f32[256,256]{1,0} parameter(0)
  ROOT %n = f32[256,256]{1,0} negate(%p)
}

ENTRY %main {
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  %z = f32[256,256]{1,0} parameter(2)
  %ags = (f32[64,256]{1,0}, f32[256,256]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %agd = f32[256,256]{1,0} all-gather-done(%ags)
  %ags2 = (f32[64,256]{1,0}, f32[256,256]{1,0}) all-gather-start(%y), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %neg = f32[256,256]{1,0} fusion(%z), kind=kLoop, calls=%neg_f
  %agd2 = f32[256,256]{1,0} all-gather-done(%ags2)
  %dot = f32[256,256]{1,0} dot(%agd, %agd2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = f32[256,256]{1,0} add(%dot, %neg)
}
"""

#: Iterations of `looped`: four kernels each, beyond the launches the
#: timeline lists one by one, so the loop is folded.
TRIPS = 30_000


@functools.cache
def transformer():
  cfg = TransformerConfig(batch=2, seq=32, d_model=64, heads=2, d_ff=128, vocab=128)
  fn, args = example(cfg)
  return hlo_audit.audit(fn, *args)


@functools.cache
def gathers():
  return hlo_audit.audit_hlo(GATHERS, options=hlo_audit.AuditOptions(device="h200"))


@functools.cache
def looped():
  def f(x):
    return jax.lax.fori_loop(0, TRIPS, lambda i, x: jnp.sin(x) * 2 + x[::-1], x)
  return hlo_audit.audit(f, jax.ShapeDtypeStruct((256,), jnp.float32))


def strict(text: str) -> dict:
  """`text` parsed as JSON, failing on NaN or Infinity."""
  def bad(constant):
    raise AssertionError(f"{constant} in the trace")
  return json.loads(text, parse_constant=bad)


def threads(doc: dict) -> dict[str, list[dict]]:
  """The complete events of each thread, by thread name, in time order."""
  names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
           if e["ph"] == "M" and e["name"] == "thread_name"}
  out: dict[str, list[dict]] = {n: [] for n in names.values()}
  for e in doc["traceEvents"]:
    if e["ph"] == "X":
      out[names[e["tid"]]].append(e)
  return {n: sorted(v, key=lambda e: e["ts"]) for n, v in out.items()}


def ns(us: float) -> int:
  """Microseconds as Perfetto reads them: whole nanoseconds."""
  return round(us * 1000)


def test_one_complete_event_per_launch_named_as_in_the_hlo():
  r = transformer()
  doc = strict(r.to_trace())
  assert doc["displayTimeUnit"] == "ns"
  (process,) = [e for e in doc["traceEvents"] if e["name"] == "process_name"]
  assert process["args"]["name"] == f"{r.module.name} on {r.timing.facts.name} (estimated)"
  rows = threads(doc)
  assert list(rows) == ["compute"]
  events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
  assert len(events) == len(r.timing.launches) > 50
  assert [e["name"] for e in rows["compute"]] == [l.kernel for l in r.timing.launches]
  assert {e["name"] for e in events} <= {k.name for k in r.kernels}
  for e, l in zip(rows["compute"], r.timing.launches):
    assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
    assert e["ts"] == pytest.approx(l.start * 1e6, abs=1e-3)
    k = r.timing.kernel(l.kernel)
    assert (e["cat"], e["args"]["bound"], e["args"]["bytes"]) == (
        k.bound.value, k.bound.value, k.bytes)
    assert e["args"]["matrix_flops"] + e["args"]["vector_flops"] == k.flops


@pytest.mark.parametrize("audit", [transformer, gathers], ids=["example", "async-gathers"])
def test_the_compute_track_sums_to_the_step_less_exposed_communication(audit):
  r = audit()
  t = r.timing
  rows = threads(strict(r.to_trace()))
  compute = rows["compute"]
  total = sum(e["dur"] for e in compute)
  # Each bar is whole nanoseconds: at most half a nanosecond off per bar.
  assert total == pytest.approx((t.step_time - t.communication_time) * 1e6,
                                abs=1e-3 * len(compute))
  if audit is gathers:
    assert t.communication_time > 0 and t.overlapped_communication > 0
    assert [e["name"] for e in rows["communication"]] == ["ags", "ags2"]
    assert [e["name"] for e in compute] == ["neg", "dot", "out"]
    end = max(e["ts"] + e["dur"] for es in rows.values() for e in es)
    assert end == pytest.approx(t.step_time * 1e6, abs=1e-3)


def test_a_folded_bar_says_how_many_launches_it_stands_for():
  r = looped()
  folded = [l for l in r.timing.launches if l.count > 1]
  assert folded and all(l.count == TRIPS for l in folded)
  events = [e for e in strict(r.to_trace())["traceEvents"] if e["ph"] == "X"]
  assert len(events) == len(r.timing.launches) < 20
  by_name = {e["name"]: e for e in events}
  for l in folded:
    e = by_name[l.kernel]
    assert e["args"]["launches"] == TRIPS
    assert e["dur"] == pytest.approx(e["args"]["time_per_launch_us"] * TRIPS, rel=1e-6)
  assert sum(e["args"]["launches"] for e in events) == sum(l.count for l in r.timing.launches)


def test_kernels_a_finding_names_carry_its_class_and_time_saved():
  r = transformer()
  named = 0
  for e in strict(r.to_trace())["traceEvents"]:
    if e["ph"] != "X":
      continue
    expected = [f for f in r.actionable if e["name"] in (f.producer, *f.consumers)]
    got = e["args"].get("findings", [])
    assert [g["class"] for g in got] == [f.kind.value for f in expected], e["name"]
    for g, f in zip(got, expected):
      assert g["time_saved_us"] == pytest.approx(f.time_saved * 1e6)
      assert (g["boundary"], g["bytes_saved"]) == (f.boundary or None, f.bytes_saved)
    named += bool(got)
  # Consumers count too: some kernel is named only as a finding's consumer.
  producers = {f.producer for f in r.actionable}
  assert named > 10 and any(c not in producers for f in r.actionable for c in f.consumers)


def _by_hand(report, names: list[str], launches: list[Launch]):
  """`report` with a hand-made estimate: kernels `names`, the `launches`."""
  facts = report.timing.facts
  kernels = tuple(KernelTime(name=n, bytes=1 << 20, matrix_flops=0, vector_flops=1 << 18,
                             transcendentals=0, launches=1, memory_time=2e-6,
                             compute_time=1e-6, launch_time=1e-6) for n in names)
  step = max(l.start + l.duration for l in launches)
  timing = StepTime(facts=facts, kernels=kernels, step_time=step, memory_time=step,
                    compute_time=0.0, launch_time=0.0, communication_time=0.0,
                    launches=tuple(launches),
                    _by_name=types.MappingProxyType({k.name: k for k in kernels}))
  return dataclasses.replace(report, timing=timing)


def test_the_file_is_strict_json_with_names_from_the_hlo_escaped(tmp_path):
  base = gathers()
  odd = 'fusion"\\.1\n</script><b>&amp;\u00e9'
  f = dataclasses.replace(base.actionable[0], producer=odd, consumers=(),
                          time_saved=float("nan"))
  r = dataclasses.replace(_by_hand(base, [odd], [Launch(odd, 0.0, 3e-6)]), findings=(f,))
  path = tmp_path / "step.json"
  text = r.to_trace(str(path))
  assert path.read_text(encoding="utf-8") == text
  (event,) = [e for e in strict(text)["traceEvents"] if e["ph"] == "X"]
  assert event["name"] == odd and event["dur"] == 3.0
  assert event["args"]["findings"][0]["time_saved_us"] is None


def test_overlapping_bars_of_a_track_go_to_rows_that_do_not_overlap():
  # A bar ending one float step after the next one starts (the same instant
  # reached by another sum) whose end rounds to the next nanosecond.
  end = next(x for x in ((k + 0.5) * 1e-9 for k in range(1000, 3000))
             if round(x * 1e9) != round(math.nextafter(x, 0) * 1e9))
  launches = [Launch("a", 0.0, end), Launch("b", math.nextafter(end, 0), 1e-6),
              Launch("c0", 0.0, 5e-6, "communication"),
              Launch("c1", 2e-6, 5e-6, "communication"),
              Launch("c2", 5e-6, 1e-6, "communication")]
  r = _by_hand(gathers(), ["a", "b", "c0", "c1", "c2"], launches)
  rows = threads(strict(r.to_trace()))
  assert {n: [e["name"] for e in es] for n, es in rows.items()} == {
      "compute": ["a", "b"], "communication": ["c0", "c2"], "communication 2": ["c1"]}
  for es in rows.values():
    for e, nxt in zip(es, es[1:]):
      assert ns(e["ts"]) + ns(e["dur"]) <= ns(nxt["ts"]), (e, nxt)


def test_without_an_estimate_to_trace_says_why_in_one_sentence():
  r = dataclasses.replace(transformer(), timing=None, notes=(
      "time not estimated: the device is unknown (name it: --device h200)",))
  with pytest.raises(HloAuditError) as e:
    r.to_trace()
  assert str(e.value) == "no trace: the device is unknown (name it: --device h200)"
  read = report_from_dict(json.loads(transformer().to_json()))
  assert read.timing is not None and not read.timing.launches
  with pytest.raises(HloAuditError, match=r"^no trace: the report was read from JSON, "):
    trace.to_trace(read)


def test_a_launch_the_estimate_lacks_is_filed_under_its_track():
  launches = [Launch("known", 0.0, 1e-6), Launch("lost", 1e-6, 1e-6),
              Launch("lost_c", 0.0, 1e-6, "communication")]
  r = _by_hand(gathers(), ["known"], launches)
  events = {e["name"]: e for e in strict(r.to_trace())["traceEvents"] if e["ph"] == "X"}
  assert events["known"]["cat"] == r.timing.kernel("known").bound.value == "memory"
  assert (events["lost"]["cat"], events["lost_c"]["cat"]) == ("compute", "communication")
  assert "bound" not in events["lost"]["args"]

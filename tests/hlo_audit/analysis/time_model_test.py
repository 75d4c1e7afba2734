"""The time model: kernels priced on a device, the step along the schedule,
findings priced in time, checked against physics and hand-worked numbers."""

from __future__ import annotations

import dataclasses
import gzip
import re
import pathlib

import pytest

import hlo_audit
from hlo_audit import AuditOptions, Bound, DeviceFacts, FindingKind
from hlo_audit._src.analysis import time_model
from hlo_audit._src.analysis.records import with_changes
from hlo_audit._src.report.grouping import ranked_groups
from tests.gpu_target import gpu_target  # noqa: F401 - a fixture

FIXTURES = pathlib.Path(__file__).parent / "time_fixtures"

#: A device with round numbers: 100 GB/s, 1 TFLOP/s on the matrix unit, 100
#: GFLOP/s elementwise, 1 us per launch, 10 GB/s links and 2 us per collective.
FACTS = DeviceFacts(
    name="test", description="a test device", platform="gpu", memory_bandwidth=1e11,
    matrix_flops={"f32": 1e12}, vector_flops={"f32": 1e11},
    transcendentals_per_second=1e10, launch_overhead=1e-6, link_bandwidth=1e10,
    collective_latency=2e-6)


def audit(text: str, device=FACTS) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(text, options=AuditOptions(device=device))


def fixture(name: str) -> str:
  path = FIXTURES / name
  data = path.read_bytes()
  return (gzip.decompress(data) if name.endswith(".gz") else data).decode()


# ------------------------------------------------------ on an H200 ----------


def test_h200_matmul_is_compute_bound_at_the_tensor_core_rate():
  # XLA:GPU's own compile of a 4096^3 bf16 matmul for an H200 (committed):
  # 2 * 4096^3 FLOPs at NVIDIA's 989 dense bf16 TFLOP/s.
  r = audit(fixture("matmul_4096_bf16.hlo"), device="h200")
  (k,) = r.timing.kernels
  physics = 2 * 4096 ** 3 / 989e12
  assert k.bound is Bound.COMPUTE
  assert k.matrix_flops == 2 * 4096 ** 3
  assert physics / 2 <= k.time <= 2 * physics
  assert k.time == pytest.approx(physics + 1e-6, rel=0.01)  # the roofline and a launch
  assert r.timing.step_time == pytest.approx(k.time)
  assert k.intensity == pytest.approx(2 * 4096 ** 3 / (3 * 4096 * 4096 * 2))


def test_h200_add_is_memory_bound_at_hbm_bandwidth():
  # A 256 MiB f32 add: three passes (two reads, one write) over 4.8 TB/s.
  r = audit(fixture("add_256mib.hlo"), device="h200")
  (k,) = r.timing.kernels
  physics = 3 * 256 * 2 ** 20 / 4.8e12
  assert k.bound is Bound.MEMORY
  assert k.bytes == 3 * 256 * 2 ** 20
  assert physics / 2 <= k.time <= 2 * physics
  assert k.memory_time == pytest.approx(physics)
  assert r.timing.memory_time == pytest.approx(physics)
  assert r.timing.launch_time == pytest.approx(1e-6)
  assert "not yet checked" in r.timing.facts.checked


def test_cross_entropy_head_ranks_the_logits_first_by_time():
  # optax's integer-label cross-entropy over a 32k vocabulary, bf16 logits,
  # AdamW, compiled for an H200: the logits' f32 gradient, written whole
  # around the one-hot scatter of the labels and read back by its cast
  # (64 MiB), then its bf16 cast into the backward gemm (32 MiB) cost the
  # most time, while the undonated arguments hold the most memory. By peak
  # (the old ranking) a donation came second, before the cast (no peak).
  r = audit(fixture("ce_head_h200.hlo.gz"), device="h200")
  by_time = r.groups
  first = by_time[0]
  assert first.boundary_shape == "f32[256,32768]" and "one-hot scatter" in first.ops
  assert by_time[1].boundary_shape == "bf16[256,32768]"
  assert first.time_saved == max(g.time_saved or 0 for g in by_time)
  by_peak = [g for g in ranked_groups(r.findings, "peak") if g.actionable]
  assert by_peak[1].kind is FindingKind.UNDONATED_ARGUMENT
  text = r.to_text(width=160, top=3)
  rows = [line for line in text.splitlines() if line.strip().startswith("1 ")]
  assert rows and "f32[256,32768]" in rows[0]
  assert "estimated step on h200" in text
  assert re.search(r"top \d fixes: ~[\d.]+ us of [\d.]+ us", text)


# ------------------------------------------------------------ kernels ----

_ELEMENTWISE = """HloModule m, is_scheduled=true

%f1 (p: f32[1048576], q: f32[1048576]) -> f32[1048576] {
  %p = f32[1048576]{0} parameter(0)
  %q = f32[1048576]{0} parameter(1)
  ROOT %a = f32[1048576]{0} add(%p, %q)
}

%f2 (p: f32[1048576]) -> f32[1048576] {
  %p = f32[1048576]{0} parameter(0)
  ROOT %e = f32[1048576]{0} exponential(%p)
}

ENTRY %main (x: f32[1048576], y: f32[1048576]) -> f32[1048576] {
  %x = f32[1048576]{0} parameter(0)
  %y = f32[1048576]{0} parameter(1)
  %sum = f32[1048576]{0} fusion(%x, %y), kind=kLoop, calls=%f1
  ROOT %exp = f32[1048576]{0} fusion(%sum), kind=kLoop, calls=%f2
}
"""

N = 1048576


def test_a_kernel_is_the_roofline_of_its_bytes_and_work_plus_a_launch():
  r = audit(_ELEMENTWISE)
  add, exp = r.timing.kernel("sum"), r.timing.kernel("exp")
  # The add reads two arrays and writes one: 12 MiB at 100 GB/s; N FLOPs at
  # 100 GFLOP/s hide under it.
  assert add.bytes == 12 * N and add.vector_flops == N and add.transcendentals == 0
  assert add.memory_time == pytest.approx(12 * N / 1e11)
  assert add.compute_time == pytest.approx(N / 1e11)
  assert add.bound is Bound.MEMORY
  assert add.time == pytest.approx(12 * N / 1e11 + 1e-6)
  # exp: N transcendentals at 1e10/s (105 us) outweigh its 8 MiB (84 us).
  assert exp.transcendentals == N and exp.vector_flops == 0
  assert exp.bound is Bound.COMPUTE
  assert exp.time == pytest.approx(N / 1e10 + 1e-6)
  assert r.timing.step_time == pytest.approx(add.time + exp.time)
  assert r.timing.memory_time == pytest.approx(12 * N / 1e11)
  assert r.timing.compute_time == pytest.approx(N / 1e10)
  assert r.timing.launch_time == pytest.approx(2e-6)


def test_a_tiny_kernel_is_launch_bound():
  r = audit(_ELEMENTWISE.replace("1048576", "16"))
  k = r.timing.kernel("sum")
  assert k.bound is Bound.LAUNCH and k.time == pytest.approx(1e-6 + 12 * 16 / 1e11)


def test_a_cache_level_prices_working_sets_that_fit_it():
  facts = DeviceFacts(name="t", description="t", platform="gpu", memory_bandwidth=1e11,
                      cache_bandwidths=((12 * N, 4e11),), vector_flops={"f32": 1e13},
                      launch_overhead=1e-6)
  assert facts.bandwidth(12 * N) == 4e11  # up to the size, inclusive
  assert facts.bandwidth(12 * N + 1) == 1e11
  r = audit(_ELEMENTWISE, device=facts)
  assert r.timing.kernel("sum").memory_time == pytest.approx(12 * N / 4e11)  # fits
  assert r.timing.kernel("exp").memory_time == pytest.approx(8 * N / 4e11)


_XLA_CPU = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%rows (p: f32[1024,1024]) -> f32[1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[1024]{0} reduce(%p, %z), dimensions={1}, to_apply=%add
}

%swap (p: f32[1024,1024]) -> f32[1024,1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  ROOT %t = f32[1024,1024]{1,0} transpose(%p), dimensions={1,0}
}

ENTRY %main (x: f32[1024,1024]) -> (f32[1024], f32[1024], f32[1024,1024]) {
  %x = f32[1024,1024]{1,0} parameter(0)
  %loop = f32[1024]{0} fusion(%x), kind=kLoop, calls=%rows
  %lib = f32[1024]{0} fusion(%x), kind=kCustom, calls=%rows, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %tr = f32[1024,1024]{1,0} fusion(%x), kind=kLoop, calls=%swap
  ROOT %out = (f32[1024], f32[1024], f32[1024,1024]) tuple(%loop, %lib, %tr)
}
"""


def test_xla_cpu_prices_reductions_by_who_emits_them_and_transposes_as_strided():
  # XLA:CPU's loop emitter reduces one element at a time (1e8/s here), its
  # library faster (1e9/s); a transpose of the minor dimension streams at the
  # strided bandwidth. A device without those facts (a GPU's) prices all
  # three by their bytes and FLOPs.
  n = 1024 * 1024
  cpu = DeviceFacts(name="c", description="c", platform="cpu", memory_bandwidth=1e11,
                    vector_flops={"f32": 1e12}, launch_overhead=1e-6,
                    loop_reduction_rate=1e8, reduction_rate=1e9, strided_bandwidth=1e10)
  r = audit(_XLA_CPU, device=cpu)
  loop, lib, tr = (r.timing.kernel(n_) for n_ in ("loop", "lib", "tr"))
  assert loop.compute_time == pytest.approx(n / 1e8) and loop.bound is Bound.COMPUTE
  assert lib.compute_time == pytest.approx(n / 1e9)
  assert tr.strided and tr.memory_time == pytest.approx(8 * n / 1e10)
  plain = audit(_XLA_CPU, device=dataclasses.replace(
      cpu, loop_reduction_rate=0.0, reduction_rate=0.0, strided_bandwidth=0.0))
  assert plain.timing.kernel("loop").compute_time == pytest.approx(n / 1e12)
  assert plain.timing.kernel("lib").compute_time == pytest.approx(n / 1e12)
  assert plain.timing.kernel("tr").memory_time == pytest.approx(8 * n / 1e11)


# ------------------------------------------------------------ the step ----

_LOOP = """HloModule m, is_scheduled=true

%body_f (p: f32[1048576]) -> f32[1048576] {
  %p = f32[1048576]{0} parameter(0)
  ROOT %n = f32[1048576]{0} negate(%p)
}

%body (s: (s32[], f32[1048576])) -> (s32[], f32[1048576]) {
  %s = (s32[], f32[1048576]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %v = f32[1048576]{0} get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %w = f32[1048576]{0} fusion(%v), kind=kLoop, calls=%body_f
  ROOT %t = (s32[], f32[1048576]{0}) tuple(%i1, %w)
}

%cond (s: (s32[], f32[1048576])) -> pred[] {
  %s = (s32[], f32[1048576]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %k = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (x: f32[1048576]) -> f32[1048576] {
  %x = f32[1048576]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[1048576]{0}) tuple(%zero, %x)
  %loop = (s32[], f32[1048576]{0}) while(%init), condition=%cond, body=%body, BACKEND
  ROOT %out = f32[1048576]{0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_body_runs_its_trip_count_times():
  r = audit(_LOOP.replace("BACKEND", 'backend_config={"known_trip_count":{"n":"4"}}'))
  w = r.timing.kernel("w")
  assert w.launches == 4
  per_iteration = sum(r.timing.kernel(n).time_per_launch for n in ("w", "i1", "lt"))
  assert r.timing.step_time == pytest.approx(4 * per_iteration)
  assert len([x for x in r.timing.launches if x.kernel == "w"]) == 4
  assert not any("trip count" in a for a in r.timing.assumptions)


def test_a_loop_without_a_trip_count_is_counted_once_and_says_so():
  r = audit(_LOOP.replace(", BACKEND", ""))
  per_iteration = sum(r.timing.kernel(n).time_per_launch for n in ("w", "i1", "lt"))
  assert r.timing.step_time == pytest.approx(per_iteration)
  assert any("no trip count" in a for a in r.timing.assumptions)


_ASYNC = """HloModule m, is_scheduled=true, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%neg (p: f32[SIZE]) -> f32[SIZE] {
  %p = f32[SIZE]{0} parameter(0)
  ROOT %n = f32[SIZE]{0} negate(%p)
}

ENTRY %main (x: f32[1048576], y: f32[SIZE]) -> (f32[1048576], f32[SIZE]) {
  %x = f32[1048576]{0} parameter(0)
  %y = f32[SIZE]{0} parameter(1)
  %ars = f32[1048576]{0} all-reduce-start(%x), channel_id=1, replica_groups={{0,1}}, to_apply=%sum
  %work = f32[SIZE]{0} fusion(%y), kind=kLoop, calls=%neg
  %ard = f32[1048576]{0} all-reduce-done(%ars)
  ROOT %r = (f32[1048576]{0}, f32[SIZE]{0}) tuple(%ard, %work)
}
"""


@pytest.mark.parametrize("size", [16, 8 * N])
def test_an_async_collective_is_exposed_only_where_the_kernels_between_do_not_hide_it(size):
  r = audit(_ASYNC.replace("SIZE", str(size)))
  ar, work = r.timing.kernel("ars"), r.timing.kernel("work")
  # A ring all-reduce of 4 MiB over two devices sends 4 MiB each way: 419 us
  # at 10 GB/s, plus the 2 us latency.
  assert ar.bound is Bound.COMMUNICATION and ar.overlapped
  assert ar.communication_time == pytest.approx(4 * N / 1e10 + 2e-6)
  exposed = max(0.0, ar.time - work.time)
  assert r.timing.communication_time == pytest.approx(exposed)
  assert r.timing.overlapped_communication == pytest.approx(ar.time - exposed)
  assert r.timing.step_time == pytest.approx(work.time + exposed)
  tracks = {x.track for x in r.timing.launches}
  assert tracks == {"compute", "communication"}


# ------------------------------------------------------------ findings ----


def _record(r, kind, producer, consumers, bytes_saved, launches=1, trip=1):
  base = next(iter(r.findings), None)
  if base is None:  # any record to copy the fixed fields from
    from hlo_audit._src.analysis.records import (FusionDecisionRecord, NumericalClass,
                                                 Verdict)
    base = FusionDecisionRecord(
        kind=kind, producer="", consumers=(), boundary="", boundary_shape="",
        bytes_saved=0, launches_removed=0, extra_arithmetic="", extra_resources="",
        numerical_class=NumericalClass.EXACT, guard="", layout_effect="", evidence="",
        verdict=Verdict.SAFE, reasons=(), risks=())
  return with_changes(base, kind=kind, producer=producer, consumers=tuple(consumers),
                      boundary=producer, bytes_saved=bytes_saved, launches_removed=launches,
                      trip_count=trip)


def test_fusing_two_memory_bound_kernels_saves_the_boundary_traffic_and_a_launch():
  r = audit(_ELEMENTWISE.replace("exponential", "negate"))
  f = _record(r, FindingKind.UNFUSED_EPILOGUE, "sum", ["exp"], 2 * 4 * N)
  # The sum's write and the negate's read of it go: 8 MiB at 100 GB/s, and
  # one of the two launches.
  assert time_model.time_saved(f, r.timing) == pytest.approx(8 * N / 1e11 + 1e-6)


_GEMM_EPILOGUE = """HloModule m, is_scheduled=true

%mm (a: f32[512,512], b: f32[512,512]) -> f32[512,512] {
  %a = f32[512,512]{1,0} parameter(0)
  %b = f32[512,512]{1,0} parameter(1)
  ROOT %d = f32[512,512]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%ep (p: f32[512,512], r: f32[512,512]) -> f32[512,512] {
  %p = f32[512,512]{1,0} parameter(0)
  %r = f32[512,512]{1,0} parameter(1)
  ROOT %s = f32[512,512]{1,0} add(%p, %r)
}

ENTRY %main (a: f32[512,512], b: f32[512,512], r: f32[512,512]) -> f32[512,512] {
  %a = f32[512,512]{1,0} parameter(0)
  %b = f32[512,512]{1,0} parameter(1)
  %r = f32[512,512]{1,0} parameter(2)
  %gemm = f32[512,512]{1,0} fusion(%a, %b), kind=kOutput, calls=%mm
  ROOT %residual = f32[512,512]{1,0} fusion(%gemm, %r), kind=kLoop, calls=%ep
}
"""


def test_an_epilogue_fused_into_a_compute_bound_gemm_hides_under_its_arithmetic():
  # The gemm: 2 * 512^3 FLOPs at 1 TFLOP/s (268 us) against 3 MiB (31 us).
  # Its residual-add epilogue moves 3 MiB (31 us) of which the fusion removes
  # the 1 MiB written and read back (21 us); fused, the rest of the
  # epilogue's traffic hides under the gemm's arithmetic too: the whole
  # epilogue goes, not just the boundary's traffic.
  r = audit(_GEMM_EPILOGUE)
  gemm, epilogue = r.timing.kernel("gemm"), r.timing.kernel("residual")
  assert gemm.bound is Bound.COMPUTE and epilogue.bound is Bound.MEMORY
  f = _record(r, FindingKind.UNFUSED_EPILOGUE, "gemm", ["residual"], 2 * 512 * 512 * 4)
  saved = time_model.time_saved(f, r.timing)
  traffic_only = 2 * 512 * 512 * 4 / 1e11 + 1e-6
  assert saved == pytest.approx(epilogue.time - epilogue.compute_time)
  assert saved > 1.3 * traffic_only


def test_hoisting_loop_invariant_work_saves_all_but_one_trip():
  r = audit(_LOOP.replace("BACKEND", 'backend_config={"known_trip_count":{"n":"4"}}'))
  f = _record(r, FindingKind.LOOP_INVARIANT, "w", [], 0, launches=3, trip=4)
  w = r.timing.kernel("w")
  assert time_model.time_saved(f, r.timing) == pytest.approx(3 * w.time_per_launch)


def test_a_remat_costs_its_recompute_and_a_donation_costs_nothing():
  r = audit(_ELEMENTWISE)
  remat = _record(r, FindingKind.REMAT_CANDIDATE, "sum", [], 0)
  assert time_model.time_saved(remat, r.timing) == pytest.approx(
      -r.timing.kernel("sum").time_per_launch)
  donate = _record(r, FindingKind.UNDONATED_ARGUMENT, "", [], 0)
  assert time_model.time_saved(donate, r.timing) == 0.0


def test_exposed_communication_saves_the_collective_and_a_reshard_its_copy():
  r = audit(_ASYNC.replace("SIZE", "16"))
  f = _record(r, FindingKind.EXPOSED_COLLECTIVE, "ars", ["ard"], 0, launches=0)
  assert time_model.time_saved(f, r.timing) == pytest.approx(r.timing.kernel("ars").time)
  # A resharding copy around the collective: the copy (here the "work"
  # kernel stands in) goes, the collective stays.
  copy = with_changes(_record(r, FindingKind.RESHARD_AROUND_COLLECTIVE, "ars", ["ard"], 0,
                              launches=0), boundary="work")
  assert time_model.time_saved(copy, r.timing) == pytest.approx(r.timing.kernel("work").time)


def test_the_step_after_fixes_counts_each_boundary_once():
  r = audit(_ELEMENTWISE.replace("exponential", "negate"))
  f = _record(r, FindingKind.UNFUSED_EPILOGUE, "sum", ["exp"], 2 * 4 * N)
  f = with_changes(f, time_saved=time_model.time_saved(f, r.timing))
  same = with_changes(f, kind=FindingKind.SEPARATE_REDUCTION)
  after = time_model.step_after(r.timing, [f, same])
  assert after == pytest.approx(r.timing.step_time - f.time_saved)


def test_every_finding_of_an_audit_is_priced():
  r = audit(fixture("ce_head_h200.hlo.gz"), device="h200")
  assert r.findings and all(f.time_saved is not None for f in r.findings)
  for f in r.findings:
    if f.kind is FindingKind.UNDONATED_ARGUMENT:
      assert f.time_saved == 0.0
    else:
      assert f.time_saved > 0


def test_without_a_device_nothing_is_priced_and_the_report_says_why():
  # XLA:GPU's HLO names no device: nothing to price it with.
  r = hlo_audit.audit_hlo(fixture("add_256mib.hlo"))
  assert r.timing is None
  assert all(f.time_saved is None for f in r.findings)
  assert any(n.startswith("time not estimated: the device is unknown") for n in r.notes)


def test_an_unknown_device_name_is_an_error():
  with pytest.raises(hlo_audit.TargetError, match="unknown target 'h9000'"):
    audit(_ELEMENTWISE, device="h9000")


def test_the_estimate_survives_json():
  from hlo_audit._src.report.json_report import report_from_dict

  r = audit(_ELEMENTWISE)
  back = report_from_dict(r.to_dict())
  assert back.timing.step_time == pytest.approx(r.timing.step_time)
  assert back.timing.kernel("exp").bound is Bound.COMPUTE
  assert back.timing.facts.memory_bandwidth == 1e11
  d = r.to_dict()
  assert d["timing"]["device"]["sources"] == {}
  assert {k["name"] for k in d["timing"]["kernels"]} == {"sum", "exp"}
  assert d["timing"]["kernels"][0]["bound"] == "memory"
  # Each part of the step's split comes back as itself.
  parts = dataclasses.replace(r.timing, memory_time=1.0, compute_time=2.0, launch_time=3.0,
                              communication_time=4.0, overlapped_communication=5.0)
  again = type(parts).from_dict(parts.to_dict())
  assert dict(again.split) == {"memory": 1.0, "compute": 2.0, "launch": 3.0,
                               "communication": 4.0}
  assert again.overlapped_communication == 5.0


# ------------------------------------------- compiled here for an H200 ----


def test_h200_compiles_here_price_as_the_committed_ones(gpu_target):
  """The same programs compiled now, through the CUDA plugin on this machine:
  the physics holds for the installed XLA's kernels, and the head's logits'
  gradient and then the logits still rank first."""
  import jax
  import jax.numpy as jnp

  from tests.hlo_audit.analysis import ce_head

  S = jax.ShapeDtypeStruct
  mm = hlo_audit.audit(jax.jit(lambda a, b: a @ b), S((4096, 4096), jnp.bfloat16),
                       S((4096, 4096), jnp.bfloat16), target="h200")
  (gemm,) = [k for k in mm.timing.kernels if k.matrix_flops]
  assert gemm.bound is Bound.COMPUTE
  assert 0.5 <= gemm.time / (2 * 4096 ** 3 / 989e12) <= 2
  n = 64 * 1024 * 1024
  add = hlo_audit.audit(jax.jit(lambda x, y: x + y), S((n,), jnp.float32),
                        S((n,), jnp.float32), target="h200")
  (k,) = add.timing.kernels
  assert k.bound is Bound.MEMORY and 0.5 <= k.time / (3 * 4 * n / 4.8e12) <= 2
  fn, args = ce_head.build()
  head = hlo_audit.audit(fn, *args, target="h200")
  assert [g.boundary_shape for g in head.groups[:2]] == ["f32[256,32768]",
                                                        "bf16[256,32768]"]
  assert head.timing.facts.name == "h200"

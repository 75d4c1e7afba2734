"""TPU targets: names, per-device facts, and
(with libtpu installed) the example audited for a v5e: its HBM peak, its
step beside libtpu's, and the CLI verbs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import hlo_audit
from hlo_audit._src.errors import TargetError
from hlo_audit._src.target import tpus, wheels
from tests.tpu_target import require_tpu_target

# ------------------------------------------------------------------ names ----


@pytest.mark.parametrize("name, topology, chips, devices", [
    ("v5e", "v5e:1x1", 1, 1),
    ("V5E:2x2", "v5e:2x2", 4, 4),
    ("v6e:1x2", "v6e:1x2", 2, 2),
    ("v5p:2x2x1", "v5p:2x2x1", 4, 4),    # a device is a megacore of both cores
    ("v4", "v4:1x1x1", 1, 2),             # libtpu makes each v4 core a device
    ("trillium", "v6e:1x1", 1, 1),
])
def test_a_name_picks_a_generation_and_a_slice(name, topology, chips, devices):
  topo = tpus.parse_topology(name)
  assert (topo.name, topo.chips, topo.device_count) == (topology, chips, devices)
  target = hlo_audit.get_target(name)
  assert (target.platform, target.device_count) == ("tpu", devices)
  assert target.device_kind == topo.generation.device_kind


@pytest.mark.parametrize("name, words", [
    ("v5e:2x2x1", "a v5e slice has 2 axes"),
    ("v5p:2x2", "a v5p slice has 3 axes"),
    ("v5e:0x2", "a v5e slice has 2 axes"),
])
def test_a_slice_of_the_wrong_shape_says_how_many_axes(name, words):
  with pytest.raises(TargetError, match=words):
    hlo_audit.get_target(name)


def test_an_unknown_name_lists_the_tpus_too():
  with pytest.raises(TargetError) as e:
    hlo_audit.get_target("v7x")
  assert "h200" in str(e.value) and "v5e" in str(e.value)


def test_gpus_with_a_tpu_target_is_refused():
  with pytest.raises(TargetError, match="names its chips in its topology"):
    hlo_audit.get_target("v5e", gpus=4)


# ------------------------------------------------------------------ facts ----


def test_a_v4_device_has_half_a_chip():
  v4 = tpus.parse_topology("v4").generation
  facts = tpus.tpu_facts(v4)
  assert facts.memory_bandwidth == pytest.approx(v4.hbm_bandwidth * v4.hbm_fraction / 2)
  assert facts.matrix_rate("bf16") == pytest.approx(v4.bf16_flops / 2)
  # libtpu's own rate for a large bf16 matmul on one v4 device: 137 TFLOP/s.
  assert facts.matrix_rate("bf16") == pytest.approx(137e12, rel=0.01)


@pytest.mark.parametrize("name, bf16, int8", [
    # Google's pages, per chip: int8 runs at twice bf16's rate but on v4.
    ("v4", 275e12, 275e12), ("v5e", 197e12, 394e12), ("v5p", 459e12, 918e12),
    ("v6e", 918e12, 1836e12)])
def test_a_chips_matrix_rates_are_googles_bf16_and_int8_peaks(name, bf16, int8):
  gen = tpus.parse_topology(name).generation
  facts = tpus.tpu_facts(gen)
  share = gen.devices_per_chip
  assert facts.matrix_rate("bf16") * share == pytest.approx(bf16)
  assert facts.matrix_rate("s8") * share == pytest.approx(int8)


@pytest.mark.parametrize("name, libtpu", [
    # bytes accessed / optimal_seconds of x * 2 on 512 MiB of f32, one device
    # (libtpu 0.0.42.1 and 0.0.50.1 alike).
    ("v4", 491.24e9), ("v5e", 737.66e9), ("v5p", 2350.42e9), ("v6e", 1638.0e9)])
def test_a_tpu_streams_hbm_at_libtpus_rate(name, libtpu):
  facts = hlo_audit.device_facts(name)
  assert facts.memory_bandwidth == pytest.approx(libtpu, rel=1e-4)
  assert facts.on_chip_bandwidth == facts.memory_bandwidth
  assert "0.0.50.1" in facts.sources["memory_bandwidth"]


def test_a_v5e_chip_matches_googles_page_and_libtpus_rates():
  facts = hlo_audit.device_facts("v5e")
  assert facts.platform == "tpu"
  assert facts.matrix_rate("bf16") == pytest.approx(197e12)
  assert facts.matrix_rate("s8") == pytest.approx(394e12)
  assert facts.memory_bandwidth == pytest.approx(819e9 * 0.9007)
  assert facts.link_bandwidth == pytest.approx(200e9)  # 400 GB/s both ways
  assert facts.vector_rate("f32") == 0.0  # libtpu bounds no elementwise arithmetic
  assert facts.on_chip_bandwidth == facts.memory_bandwidth
  assert facts.index_block == (8, 128)
  for fact in ("memory_bandwidth", "matrix_flops", "vector_flops", "link_bandwidth",
               "transcendentals_per_second", "launch_overhead", "on_chip_bandwidth",
               "index_block"):
    assert facts.sources[fact]
  # What jax calls the device names the same facts.
  assert hlo_audit.device_facts("TPU v5 lite") == facts


def test_device_facts_keep_the_on_chip_rate_through_json():
  facts = hlo_audit.device_facts("v6e")
  assert hlo_audit.DeviceFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts


# ------------------------------------------------------------- lockfile ----


def test_a_machine_without_a_tpu_may_load_libtpu_twice(monkeypatch):
  monkeypatch.setattr(wheels, "has_tpu", lambda: False)
  env = {}
  wheels.prepare_libtpu(env)
  assert env == {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  monkeypatch.setattr(wheels, "has_tpu", lambda: True)
  env = {}
  wheels.prepare_libtpu(env)
  assert env == {}  # a TPU VM's lock guards its chips


def test_libtpus_lines_about_the_vm_this_is_not_are_noise():
  noise = wheels._LIBTPU_NOISE
  assert noise.match("Failed to find host bounds for accelerator type: WARNING: could not "
                     "determine TPU accelerator type, please set env var")
  assert noise.match("WARNING: Logging before InitGoogle() is written to STDERR")
  assert not noise.match("INVALID_ARGUMENT: Topology layout is not divisible")


# ------------------------------------------------- compiled by libtpu ----

@pytest.fixture(scope="module")
def v5e_example():
  require_tpu_target()
  from hlo_audit import examples
  fn, args = examples.example(examples.TransformerConfig(layers=2, batch=8))
  return hlo_audit.audit(fn, *args, target="v5e")


#: The libtpus whose footprints the peaks were checked against, finding by
#: finding (0.0.50 keeps temporaries out of outputs' allocations:
#: compat.libtpu_temporaries_share_outputs).
CHECKED_LIBTPU = ("0.0.42", "0.0.50")


def test_the_examples_hbm_peak_is_xlas_footprint(v5e_example):
  r = v5e_example
  if not (wheels.libtpu_version() or "").startswith(tuple(v + "." for v in CHECKED_LIBTPU)):
    pytest.xfail(f"libtpu {wheels.libtpu_version()}: peaks checked on libtpu "
                 + " and ".join(CHECKED_LIBTPU))
  assert r.module.platform == "tpu" and r.module.target == "v5e"
  assert abs(r.peak_agreement) <= 0.01, (r.peak_bytes, r.xla_peak_bytes)


def test_the_examples_step_is_beside_libtpus(v5e_example):
  r = v5e_example
  est = r.xla_estimate
  assert est is not None and est.uncosted >= 1  # XLA:TPU staged slices on chip
  ratio = r.timing.step_time / est.seconds
  assert 0.67 <= ratio <= 1.5, ratio
  assert r.cycles_spread is not None and r.cycles_spread.kernels > 10
  assert r.timing.facts.name == "v5e"


def _cli(*argv: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "hlo_audit", *argv], capture_output=True,
                        text=True, env=env, timeout=600)


def test_the_cli_audits_the_example_for_a_v5e():
  require_tpu_target()
  p = _cli("example", "--target", "v5e", "--top", "3")
  assert p.returncode == 0, p.stderr
  assert "estimated step on v5e (TPU v5 lite)" in p.stdout
  flat = " ".join(p.stdout.split())  # the terminal wraps long lines
  assert "libtpu's estimate" in flat and "ConcatBitcast" in flat
  assert re.search(r"XLA's [\d.]+ [KM]iB \([-+]\d+\.\d+%\)", flat), flat[:400]
  assert "WARNING" not in p.stderr  # libtpu's lines about a TPU VM are filtered


def test_targets_lists_the_tpu_generations():
  p = _cli("targets", "--json")
  assert p.returncode == 0, p.stderr
  listed = {t["name"]: t for t in json.loads(p.stdout)["tpus"]}
  assert set(listed) == {"v4", "v5e", "v5p", "v6e"}
  assert listed["v4"]["devices_per_chip"] == 2
  assert listed["v5e"]["device_facts"]["platform"] == "tpu"


def test_run_and_sweep_compile_for_a_tpu(tmp_path):
  require_tpu_target()
  module = tmp_path / "model.py"
  module.write_text("import jax\n\ndef f(x, w):\n  return jax.nn.gelu(x @ w).sum()\n")
  p = _cli("run", f"{module}:f", "--arg", "bf16[512,512]", "--arg", "bf16[512,2048]",
           "--target", "v6e", "--json")
  assert p.returncode == 0, p.stderr
  report = json.loads(p.stdout)
  assert report["module"]["target"] == "v6e"
  assert report["timing"]["device"]["name"] == "v6e"
  assert report["xla_estimate"]["seconds"] > 0
  out = tmp_path / "sweep"
  p = _cli("sweep", "example", "--target", "v5e:2x2", "--grid", "batch=4,8", "--out", str(out),
           "--no-progress", "--jobs", "0")
  assert p.returncode == 0, p.stderr
  rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
  assert [r["status"] for r in rows] == ["ok", "ok"], rows[0]
  assert {(r["audit"]["target"], r["audit"]["time_device"]) for r in rows} == {("v5e:2x2", "v5e")}
  assert all(abs(r["audit"]["peak_agreement"]) <= 0.01 for r in rows)


def test_file_prices_tpu_hlo_for_the_target_named(tmp_path):
  # Compiled HLO needs no libtpu to read: --target names the device to price it for.
  from tests.hlo_audit.analysis.on_chip_memory_test import _TPU
  path = tmp_path / "tpu.hlo"
  path.write_text(_TPU)
  p = _cli("file", str(path), "--target", "v5p", "--json")
  assert p.returncode == 0, p.stderr
  report = json.loads(p.stdout)
  assert report["timing"]["device"]["name"] == "v5p"
  assert report["timing"]["device"]["platform"] == "tpu"


def test_the_examples_swap_passes_its_gate_on_a_v5e():
  # pallas_kernels' Mosaic TPU kernels compiled into XLA:TPU's program, no
  # fallback, the numerics and XLA's footprint checked.
  require_tpu_target()
  p = _cli("example", "--swap", "--target", "v5e")
  flat = " ".join(p.stdout.split())
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr
  assert "verdict: PASS" in flat
  assert re.search(r"kernels on v5e: \d+ compiled \(\d+ Pallas/Mosaic TPU\)", flat), flat[-800:]
  assert "kernels ran pass" in flat
  # XLA:TPU left no gap at the swapped lines: nothing removed is not a pass.
  assert "intermediates removed not measured 0/0 targeted findings gone" in flat


# ------------------------------------------------- gathers and scatters ----


def _scatter_module(rows: int, width: int, updates: int, dtype: str = "f32") -> str:
  tile = "T(8,128)(2,1)" if dtype == "bf16" else "T(8,128)"
  return f"""HloModule m

%add (a: {dtype}[], b: {dtype}[]) -> {dtype}[] {{
  %a = {dtype}[] parameter(0)
  %b = {dtype}[] parameter(1)
  ROOT %s = {dtype}[] add(%a, %b)
}}

%scatter (x: {dtype}[{rows},{width}], i: s32[{updates}], u: {dtype}[{updates},{width}]) -> {dtype}[{rows},{width}] {{
  %x = {dtype}[{rows},{width}]{{1,0:{tile}}} parameter(0)
  %i = s32[{updates}]{{0:T(1024)}} parameter(1)
  %u = {dtype}[{updates},{width}]{{1,0:{tile}}} parameter(2)
  ROOT %s = {dtype}[{rows},{width}]{{1,0:{tile}}} scatter(%x, %i, %u), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add
}}

ENTRY %e (x: {dtype}[{rows},{width}], i: s32[{updates}], u: {dtype}[{updates},{width}]) -> {dtype}[{rows},{width}] {{
  %x = {dtype}[{rows},{width}]{{1,0:{tile}}} parameter(0)
  %i = s32[{updates}]{{0:T(1024)}} parameter(1)
  %u = {dtype}[{updates},{width}]{{1,0:{tile}}} parameter(2)
  ROOT %k = {dtype}[{rows},{width}]{{1,0:{tile}}} fusion(%x, %i, %u), kind=kCustom, calls=%scatter
}}
"""


def _scatter_kernel(rows: int, width: int, updates: int, dtype: str = "f32"):
  r = hlo_audit.audit_hlo(_scatter_module(rows, width, updates, dtype),
                          options=hlo_audit.AuditOptions(device="v5e"))
  return r.timing.kernel("k")


@pytest.mark.parametrize("width, dtype, blocks, element", [
    (2, "f32", 1, 4),      # a row narrower than a block: one whole block
    (128, "f32", 1, 4),
    (256, "f32", 2, 4),    # two blocks side by side
    (2, "bf16", 1, 2),     # half the bytes per element, half the block
])
def test_a_tpu_scatter_reads_and_writes_a_block_per_update(width, dtype, blocks, element):
  k = _scatter_kernel(1000, width, 14031, dtype)
  assert k.indexed_bytes == 14031 * blocks * 2 * 8 * 128 * element


def test_a_tpu_scatters_time_follows_its_updates_as_libtpu_prices_them():
  # libtpu 0.0.42.1 (v5e): this scatter of 14031 updates compiled alone,
  # 177 us; one of 1000, 14.0 us.
  facts = hlo_audit.device_facts("v5e")
  for updates, libtpu in ((14031, 177e-6), (1000, 14.0e-6)):
    k = _scatter_kernel(1000, 2, updates)
    assert k.memory_time == pytest.approx(
        k.bytes / facts.memory_bandwidth + k.on_chip_bytes / facts.on_chip_bandwidth
        + updates * 2 * 4096 / facts.memory_bandwidth)
    assert 0.67 <= k.time / libtpu <= 1.5, (updates, k.time)


def _scatter_2d_kernel(rows: int, per_row: int):
  # top_k's backward: each of `rows` rows adds `per_row` scalars at (row, i).
  text = f"""HloModule m

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%scatter (x: f32[256,8], i: s32[{rows},{per_row},2], u: f32[{rows},{per_row}]) -> f32[256,8] {{
  %x = f32[256,8]{{0,1:T(8,128)}} parameter(0)
  %i = s32[{rows},{per_row},2]{{2,1,0:T(2,128)}} parameter(1)
  %u = f32[{rows},{per_row}]{{1,0:T(8,128)}} parameter(2)
  ROOT %s = f32[256,8]{{0,1:T(8,128)}} scatter(%x, %i, %u), update_window_dims={{}}, inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=2, to_apply=%add
}}

ENTRY %e (x: f32[256,8], i: s32[{rows},{per_row},2], u: f32[{rows},{per_row}]) -> f32[256,8] {{
  %x = f32[256,8]{{0,1:T(8,128)}} parameter(0)
  %i = s32[{rows},{per_row},2]{{2,1,0:T(2,128)}} parameter(1)
  %u = f32[{rows},{per_row}]{{1,0:T(8,128)}} parameter(2)
  ROOT %k = f32[256,8]{{0,1:T(8,128)}} fusion(%x, %i, %u), kind=kCustom, calls=%scatter
}}
"""
  r = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="v5e"))
  return r.timing.kernel("k")


@pytest.mark.parametrize("rows, per_row, libtpu", [
    # libtpu 0.0.42.1 (v5e), the scatter compiled alone: 1.43 us per row of
    # 128 lanes, whatever the updates per row; 36 rows pad to 40.
    (256, 2, 365.2e-6), (256, 3, 365.6e-6), (32, 2, 45.7e-6), (36, 2, 57.1e-6),
    (8, 2, 11.5e-6)])
def test_a_tpu_scatter_through_2d_indices_runs_a_whole_tile_of_them(rows, per_row, libtpu):
  k = _scatter_2d_kernel(rows, per_row)
  padded = -(-rows // 8) * 8 * 128
  assert k.indexed_bytes == padded * 2 * 8 * 128 * 4
  assert 0.95 <= k.time / libtpu <= 1.05, k.time


def test_a_tpu_scatter_through_flat_indices_runs_only_its_updates():
  # libtpu 0.0.42.1 (v5e): 64 updates through 1-D indices, 1.7 us in all,
  # not the 1024 of their tile.
  text = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%scatter (x: f32[256], i: s32[64,1], u: f32[64]) -> f32[256] {
  %x = f32[256]{0:T(256)} parameter(0)
  %i = s32[64,1]{0,1:T(1,128)} parameter(1)
  %u = f32[64]{0:T(1024)} parameter(2)
  ROOT %s = f32[256]{0:T(256)} scatter(%x, %i, %u), update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

ENTRY %e (x: f32[256], i: s32[64,1], u: f32[64]) -> f32[256] {
  %x = f32[256]{0:T(256)} parameter(0)
  %i = s32[64,1]{0,1:T(1,128)} parameter(1)
  %u = f32[64]{0:T(1024)} parameter(2)
  ROOT %k = f32[256]{0:T(256)} fusion(%x, %i, %u), kind=kCustom, calls=%scatter
}
"""
  r = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="v5e"))
  assert r.timing.kernel("k").indexed_bytes == 64 * 2 * 8 * 128 * 4


def test_devices_without_index_blocks_price_a_scatter_by_its_bytes():
  facts = hlo_audit.device_facts("h200")
  assert facts.index_block == ()
  r = hlo_audit.audit_hlo(_scatter_module(1000, 2, 14031),
                          options=hlo_audit.AuditOptions(device=facts))
  assert r.timing.kernel("k").indexed_bytes == 0


def test_an_argument_sharded_over_some_of_the_slices_chips_keeps_its_sharding():
  # A batch split over the first two chips of a v5e:2x2 is already on the
  # target: placing it must not replicate it over all four.
  require_tpu_target()
  import jax
  import numpy as np

  target = hlo_audit.get_target("v5e:2x2")
  two = jax.sharding.Mesh(np.array(target.devices()[:2]), ("data",))
  split = jax.sharding.NamedSharding(two, jax.sharding.PartitionSpec("data"))
  (x,), _ = target.place((jax.ShapeDtypeStruct((8, 4), "float32", sharding=split),))
  assert x.sharding == split, x.sharding

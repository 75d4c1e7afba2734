"""Device facts: a GPU's from XLA's own spec (held against NVIDIA's
datasheets), this machine's CPU measured and cached, each fact's source."""

from __future__ import annotations

import dataclasses
import json

import pytest

import hlo_audit
from hlo_audit import DeviceFacts
from hlo_audit._src.errors import TargetError
from hlo_audit._src.target import calibration


@pytest.mark.parametrize("name, hbm, links", [("h200", 4.8e12, 18), ("h100", 3.35232e12, 18)])
def test_hopper_facts_from_xla_spec_match_nvidia_datasheets(name, hbm, links):
  f = hlo_audit.device_facts(name)
  # NVIDIA H100/H200 SXM datasheets: 989 dense bf16 and fp16 tensor TFLOP/s,
  # 494 TF32, 1979 fp8 and int8; 67 TFLOP/s fp32 and 134 fp16 on the CUDA
  # cores; NVLink 900 GB/s both ways.
  assert f.matrix_rate("bf16") == pytest.approx(989e12, rel=0.01)
  assert f.matrix_rate("f16") == pytest.approx(989e12, rel=0.01)
  assert f.matrix_rate("f32") == pytest.approx(494.5e12, rel=0.01)
  assert f.matrix_rate("f8e4m3fn") == pytest.approx(1979e12, rel=0.01)
  assert f.matrix_rate("s8") == pytest.approx(1979e12, rel=0.01)
  assert f.vector_rate("f32") == pytest.approx(67e12, rel=0.01)
  assert f.vector_flops["bf16"] == pytest.approx(134e12, rel=0.01)
  assert f.memory_bandwidth == hbm
  assert f.link_bandwidth == links * 25e9
  # XLA:GPU's own constants: 1 us per launch, 5 us per collective, L2 at 2.5x.
  assert f.launch_overhead == 1e-6 and f.collective_latency == 5e-6
  assert f.cache_bandwidths == ((50 * 2 ** 20, 2.5 * hbm),)
  assert f.platform == "gpu" and not f.measured
  assert "not yet checked" in f.checked
  for fact in ("memory_bandwidth", "matrix_flops", "vector_flops", "launch_overhead",
               "link_bandwidth", "transcendentals_per_second"):
    assert f.sources[fact], fact


def test_a_type_without_a_matrix_rate_runs_at_the_vector_rate():
  f = hlo_audit.device_facts("h200")
  assert f.matrix_rate("c64") == f.vector_rate("c64") == f.vector_rate("f32")


def test_a_spec_without_unit_rates_falls_back_to_its_fma_units():
  # XLA's V100 spec lists no per-type rates: 80 SMs x 64 FP32 units x 2 FLOPs
  # at its clock (NVIDIA: 15.7 TFLOP/s fp32 at 1.53 GHz).
  f = hlo_audit.device_facts("v100")
  assert f.vector_rate("f32") == pytest.approx(15.7e12, rel=0.03)
  assert f.matrix_rate("bf16") == f.vector_rate("f32")
  assert "no matrix unit" in f.sources["matrix_flops"]


def test_facts_round_trip_through_a_dict_and_reject_a_broken_one():
  f = hlo_audit.device_facts("b200")
  back = DeviceFacts.from_dict(json.loads(json.dumps(f.to_dict())))
  assert back == f
  broken = f.to_dict()
  del broken["memory_bandwidth"]
  with pytest.raises(TargetError, match="memory_bandwidth"):
    DeviceFacts.from_dict(broken)


def test_facts_from_a_dict_without_optional_fields_take_the_defaults():
  # A cached calibration or report JSON written before a fact existed: the
  # missing facts are the dataclass's defaults (no launch overhead, ...).
  minimal = {"name": "old", "description": "an old cache", "platform": "cpu",
             "memory_bandwidth": 1e10}
  f = DeviceFacts.from_dict(minimal)
  assert f.launch_overhead == 0.0
  assert f == DeviceFacts(**minimal)
  # A given launch overhead survives the round trip.
  g = dataclasses.replace(f, launch_overhead=3e-6)
  assert DeviceFacts.from_dict(json.loads(json.dumps(g.to_dict()))).launch_overhead == 3e-6


def test_a_variant_scales_the_matrix_rate_and_has_its_own_narrow_curve():
  f = DeviceFacts(name="t", description="t", platform="cpu", memory_bandwidth=1e10,
                  matrix_flops={"f32": 1e11}, matrix_variants={"plain": 0.5},
                  narrow_contraction={"": ((16, 0.25), (64, 1.0)),
                                      "plain": ((16, 0.5), (256, 1.0))},
                  vector_flops={"f32": 1e10})
  assert f.matrix_rate("f32", "plain") == 5e10
  assert f.matrix_rate("f32", "nt") == f.matrix_rate("f32") == 1e11
  # Interpolated in log size: K=32 is halfway from 16 to 64 (0.25 -> 1.0).
  assert f.contraction_efficiency(32) == pytest.approx(0.5)
  assert f.contraction_efficiency(16) == pytest.approx(0.25)
  assert f.contraction_efficiency(64) == f.contraction_efficiency(4096) == 1.0
  assert f.contraction_efficiency(8) == pytest.approx(0.125)  # the first segment's slope
  assert f.contraction_efficiency(64, "plain") == pytest.approx(0.5 * 2 ** 0.5)
  assert f.contraction_efficiency(32, "nt") == pytest.approx(0.5)  # the library's curve
  assert DeviceFacts(name="g", description="g", platform="gpu",
                     memory_bandwidth=1.0).contraction_efficiency(1) == 1.0


def test_an_unknown_device_lists_the_known_ones():
  with pytest.raises(TargetError, match="unknown target 'h9000': known are .*h200"):
    hlo_audit.device_facts("h9000")


# ------------------------------------------------------------ the CPU ----


def _facts(bandwidth: float) -> DeviceFacts:
  return DeviceFacts(name="cpu", description="a CPU", platform="cpu",
                     memory_bandwidth=bandwidth, measured=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """A cache of our own, and a counter of measurements (no real ones)."""
  monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
  monkeypatch.setattr(calibration, "_facts", None)
  made = []

  def measure():
    made.append(1)
    return _facts(1e9 * len(made))

  monkeypatch.setattr(calibration, "measure", measure)
  return made


def test_the_cpu_is_measured_once_and_read_from_the_cache_after(cache, monkeypatch):
  assert hlo_audit.cpu_facts().memory_bandwidth == 1e9
  assert len(cache) == 1
  path = calibration.cache_path()
  assert path.is_file() and json.loads(path.read_text())["key"] == calibration.machine_key()
  monkeypatch.setattr(calibration, "_facts", None)  # a new process
  assert hlo_audit.cpu_facts().memory_bandwidth == 1e9
  assert len(cache) == 1
  assert hlo_audit.cpu_facts(recalibrate=True).memory_bandwidth == 2e9
  assert len(cache) == 2
  monkeypatch.setattr(calibration, "_facts", None)
  assert hlo_audit.cpu_facts().memory_bandwidth == 2e9  # the new measure was cached


def test_a_cache_of_another_machine_or_version_is_measured_again(cache, monkeypatch):
  hlo_audit.cpu_facts()
  path = calibration.cache_path()
  doc = json.loads(path.read_text())
  doc["key"]["jax"] = "0.0.1"
  path.write_text(json.dumps(doc))
  monkeypatch.setattr(calibration, "_facts", None)
  assert hlo_audit.cpu_facts().memory_bandwidth == 2e9
  path.write_text("{not json")
  monkeypatch.setattr(calibration, "_facts", None)
  assert hlo_audit.cpu_facts().memory_bandwidth == 3e9
  assert len(cache) == 3


def test_an_unwritable_cache_only_costs_a_measure(cache, monkeypatch, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  monkeypatch.setenv(calibration.CACHE_ENV, str(blocker))  # a file, not a folder
  assert hlo_audit.cpu_facts().memory_bandwidth == 1e9


def test_measuring_this_cpu_gives_plausible_facts(tmp_path, monkeypatch):
  # The real calibration, once (a few seconds): every fact positive, in the
  # range any CPU XLA runs on has, with its source.
  monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
  f = calibration.measure(runs=3)
  assert f.platform == "cpu" and f.measured
  assert 5e8 < f.memory_bandwidth < 5e12
  assert 1e9 < f.matrix_rate("f32") < 1e14
  assert 1e8 < f.vector_rate("f32") < 1e14
  assert 1e7 < f.transcendentals_per_second < 1e13
  assert 1e-8 < f.launch_overhead < 1e-3
  assert 0 <= f.parallel_overhead < 1e-2 and f.strided_bandwidth > 0
  assert all(size > 0 and rate > 0 for size, rate in f.cache_bandwidths)
  assert set(f.matrix_variants) == {"nt", "plain"}
  assert set(f.narrow_contraction) == {""}
  assert all(0 < e <= 1 for points in f.narrow_contraction.values() for _, e in points)
  for fact in ("launch_overhead", "memory_bandwidth", "matrix_flops", "vector_flops",
               "transcendentals_per_second", "strided_bandwidth", "parallel_overhead"):
    assert "measured on this machine" in f.sources[fact], fact


def test_a_spec_listing_its_unit_rates_first_reads_the_same_device_clock():
  # The rate entries carry their own clock_rate_ghz (1.83 GHz for the tensor
  # cores): the device's clock (1.98) must come from the device's field.
  from hlo_audit._src.target import devices, specs

  spec = next(s for s in specs.bundled_specs() if s.name == "h200")
  start = spec.text.index("  matrix_unit_description")
  end = spec.text.index("  thread_dim_limit_x")
  units = spec.text[start:end]
  head = spec.text.index("gpu_device_info {\n") + len("gpu_device_info {\n")
  moved = spec.text[:head] + units + spec.text[head:start] + spec.text[end:]
  assert moved.index("clock_rate_ghz: 1.8295201") < moved.index("clock_rate_ghz: 1.98")
  again = devices.gpu_facts(dataclasses.replace(spec, text=moved))
  assert again.transcendentals_per_second == devices.gpu_facts(spec).transcendentals_per_second
  assert again.matrix_rate("bf16") == pytest.approx(989e12, rel=0.01)


def test_a_spec_whose_text_opens_with_a_unit_description_reads_its_rates():
  # A spec file may start straight with a unit description (no licence
  # header): the block at offset 0 is still found, its rates read and its
  # clock kept apart from the device's.
  from hlo_audit._src.target import devices, specs

  spec = next(s for s in specs.bundled_specs() if s.name == "h200")
  start = spec.text.index("  matrix_unit_description")
  end = spec.text.index("  thread_dim_limit_x")
  units = spec.text[start:end].lstrip()
  head = spec.text.index("gpu_device_info {\n")
  moved = units + spec.text[head:start] + spec.text[end:]
  assert moved.startswith("matrix_unit_description {")
  again = devices.gpu_facts(dataclasses.replace(spec, text=moved))
  assert again.matrix_rate("bf16") == pytest.approx(989e12, rel=0.01)
  assert again.transcendentals_per_second == devices.gpu_facts(spec).transcendentals_per_second


def test_the_streaming_curve_takes_the_thread_split_s_overhead_off_split_kernels():
  # On one thread 8 kB streams at 8 GB/s, 80 kB at 6.4; at the larger one's
  # rate the two split programs take 20 and 10 us more: the split adds their
  # median, 15 us.
  points = [(8_000, 1e-6, False), (80_000, 1.25e-5, False),
            (800_000, 1.45e-4, True), (8_000_000, 1.26e-3, True)]
  overhead, curve = calibration.streaming_curve(points)
  assert overhead == pytest.approx(15e-6)
  assert [b for b, _ in curve] == [8_000, 80_000, 800_000, 8_000_000]
  rates = [r for _, r in curve]
  # 8 MB streams at 6.43 GB/s once the overhead is off; 800 kB at 6.15 and
  # 80 kB at 6.4 are raised to it (monotone), 8 kB keeps its 8.
  assert rates[3] == pytest.approx(8e6 / (1.26e-3 - 15e-6))
  assert rates[2] == rates[1] == rates[3] and rates[0] == pytest.approx(8e9)
  # No serial program to give a rate: nothing to take off.
  assert calibration.streaming_curve(points[2:])[0] == 0.0
  overhead, curve = calibration.streaming_curve(points[:2])
  assert overhead == 0.0 and [r for _, r in curve] == pytest.approx([8e9, 6.4e9])

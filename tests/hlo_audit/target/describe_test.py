"""A target says what it compiles for in one line, and the facts of the
device a saved module names are found from what jax calls that device."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit._src.target.target import device_facts, facts_for_device_kind, list_targets


@pytest.mark.parametrize("name, gpus, line", [
    ("v4", None, "v4: TPU v4, 1 chip (2 devices, one per TensorCore), compiled without one"),
    ("v5e", None, "v5e: TPU v5 lite, 1 chip, compiled without one"),
    ("v5e:2x2", None, "v5e:2x2: TPU v5 lite, 4 chips, compiled without one"),
    ("h200", None, "h200: NVIDIA H200 141GB HBM3e (sm_9.0), 1 GPU, compiled without one"),
    ("h100", 4, "4x h100-sxm: NVIDIA H100 80GB HBM3 (sm_9.0), 4 GPUs, compiled without one"),
])
def test_a_target_describes_its_device_count_and_capability(name, gpus, line):
  assert hlo_audit.get_target(name, gpus=gpus).describe() == line


def test_a_device_kind_finds_its_facts_on_its_platform():
  assert facts_for_device_kind("cpu", "").name == "cpu"
  assert facts_for_device_kind("Host", "whatever").name == "cpu"
  v5e = facts_for_device_kind("TPU", "TPU v5 lite")
  assert v5e is not None and v5e == device_facts("v5e")
  spec = list_targets()[0]
  gpu = facts_for_device_kind("cuda", spec.device_kind)
  assert gpu is not None and gpu.name == facts_for_device_kind("gpu", spec.device_kind).name
  # What no table names, or names on another platform, has no facts.
  assert facts_for_device_kind("tpu", "TPU v99") is None
  assert facts_for_device_kind("gpu", "") is None
  assert facts_for_device_kind("rocm", spec.device_kind) is None
  assert facts_for_device_kind("tpu", spec.device_kind) is None


def test_a_gpu_target_without_its_spec_describes_itself_without_a_capability():
  # A Target built by hand (a saved report's, say) may carry no spec.
  from hlo_audit._src.target.target import Target  # pylint: disable=import-outside-toplevel
  t = Target(name="h200", platform="cuda", device_kind="NVIDIA H200 141GB HBM3e")
  assert t.describe() == "h200: NVIDIA H200 141GB HBM3e, 1 GPU, compiled without one"


def test_a_spec_file_is_found_by_its_path_object():
  import pathlib  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.target.specs import find_spec  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(__file__).parents[1] / "real_models" / "h200" / "h200.txtpb"
  assert find_spec(path) == find_spec(str(path))

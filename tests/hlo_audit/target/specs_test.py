"""GPU specs and targets by name: what needs no plugin wheel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hlo_audit import TargetError
from hlo_audit._src import compat
from hlo_audit._src.target import specs, wheels
from hlo_audit._src.target.target import get_target, list_targets, resolve_target


def test_the_shipped_copies_cover_the_gpus_users_name():
  names = {s.name for s in specs.bundled_specs()}
  assert {"h100-sxm", "h100-pcie", "h200", "b200", "a100-sxm-80", "gb200"} <= names
  h200 = next(s for s in specs.bundled_specs() if s.name == "h200")
  assert h200.device_kind == "NVIDIA H200 141GB HBM3e"
  assert h200.compute_capability == "9.0" and h200.core_count == 132
  assert h200.memory_bytes == 141 * 2**30
  assert "Apache License" in h200.text  # XLA's text, header kept
  assert all(s.is_cuda for s in specs.bundled_specs())


@pytest.mark.parametrize("typed, name", [
    ("h200", "h200"), ("H200", "h200"), ("h100", "h100-sxm"), ("H100_PCIe", "h100-pcie"),
    ("a100", "a100-sxm-80"), ("b200", "b200")])
def test_names_aliases_and_spellings(typed, name):
  assert specs.find_spec(typed).name == name


def test_an_unknown_name_lists_the_known_ones():
  with pytest.raises(TargetError, match=r"unknown target 'h900': known are .*h100.*h200"):
    get_target("h900")


def test_a_spec_file_is_a_target(tmp_path):
  path = tmp_path / "mine.txtpb"
  path.write_text(specs.find_spec("h100").text.replace(
      '"NVIDIA H100 80GB HBM3"', '"NVIDIA H100 (ours)"'))
  t = get_target(str(path))
  assert t.name == str(path) and t.device_kind == "NVIDIA H100 (ours)"
  assert t.spec.source == str(path) and t.platform == "cuda"
  bad = tmp_path / "bad.txtpb"
  bad.write_text("not a spec")
  with pytest.raises(TargetError, match="not a GpuTargetConfigProto"):
    get_target(str(bad))
  with pytest.raises(TargetError, match="cannot read the spec file"):
    get_target(str(tmp_path / "missing.txtpb"))


def test_gpus_and_autotune_results_are_checked(tmp_path):
  assert get_target("h200", gpus=8).label == "8x h200"
  with pytest.raises(TargetError, match="gpus=0"):
    get_target("h200", gpus=0)
  with pytest.raises(TargetError, match="no such file"):
    get_target("h200", autotune_results=tmp_path / "nope.textproto")
  results = tmp_path / "results.textproto"
  results.write_text("version: 3\n")
  t = get_target("h200", autotune_results=results)
  assert t.autotuned and "autotuned from" in t.notes()[0]
  assert t.compiler_options() == {"xla_gpu_load_autotune_results_from": str(results)}
  assert not get_target("h200").autotuned
  assert get_target("h200").notes()[0].startswith("not autotuned")
  assert resolve_target(None) is None
  with pytest.raises(TargetError, match="need a target"):
    resolve_target(None, gpus=2)


def test_list_targets_is_every_known_spec_by_name():
  names = [s.name for s in list_targets()]
  assert names == sorted(names) and "h200" in names


def _fake_plugin(tmp_path, *texts: str):
  """A binary laid out as the plugin holds specs: NUL-terminated strings."""
  path = tmp_path / "xla_cuda_plugin.so"
  path.write_bytes(b"\x7fELF\0" + b"\0".join(t.encode() for t in texts) + b"\0tail")
  return str(path)


def test_the_plugins_embedded_specs_are_found_by_their_description(tmp_path, monkeypatch):
  h200 = specs.find_spec("h200").text
  rocm = 'gpu_device_info {\n  core_count: 304\n}\nplatform_name: "ROCM"\n' \
         'device_description_str: "MI300X"\n'
  new = h200.replace("NVIDIA H200 141GB HBM3e", "NVIDIA X300")
  path = _fake_plugin(tmp_path, "unrelated", h200, rocm, new)
  monkeypatch.setattr(specs, "plugin_library", lambda: (path, "jax-cuda12-pjrt 9.9"))
  found = {s.name: s for s in specs.plugin_specs()}
  assert set(found) == {"h200", "x300"}  # the ROCm spec needs another plugin
  assert found["h200"].text == h200 and found["h200"].source == "jax-cuda12-pjrt 9.9"
  # The plugin's spec wins over the shipped copy; names it alone knows resolve.
  assert specs.find_spec("h200").source == "jax-cuda12-pjrt 9.9"
  assert specs.find_spec("x300").device_kind == "NVIDIA X300"
  assert specs.find_spec("b200").source.startswith("hlo-audit's copy")


def test_fields_the_installed_xla_lacks_are_dropped(monkeypatch):
  spec = specs.find_spec("h200")
  assert "collective_memory_granularity" in spec.text
  monkeypatch.setattr(compat, "GPU_SPEC_FIELDS_UNKNOWN", ("collective_memory_granularity",))
  text = specs.for_installed_xla(spec)
  assert "collective_memory_granularity" not in text and "core_count: 132" in text
  monkeypatch.setattr(compat, "GPU_SPEC_FIELDS_UNKNOWN", ())
  assert specs.for_installed_xla(spec) == spec.text


def test_missing_or_mismatched_wheels_name_the_pip_command(monkeypatch):
  monkeypatch.setattr(compat, "JAXLIB_VERSION_TEXT", "0.12.0.1")
  have = {"jax-cuda12-pjrt": "0.11.2"}
  monkeypatch.setattr(wheels, "_version", have.get)
  monkeypatch.setattr(wheels.shutil, "which", lambda name: None)
  found = wheels.problems()
  assert found == ["jax-cuda12-plugin is not installed",
                   "jax-cuda12-pjrt 0.11.2 does not match jaxlib 0.12.0.1",
                   "no ptxas (nvidia-cuda-nvcc-cu12 is not installed and no CUDA "
                   "toolkit is on PATH)"]
  with pytest.raises(TargetError) as e:
    wheels.require_gpu_wheels()
  assert "\n" not in str(e.value)
  assert str(e.value).endswith(
      ": pip install 'jax-cuda12-plugin==0.12.0.1' 'jax-cuda12-pjrt==0.12.0.1' "
      "'nvidia-cuda-nvcc-cu12>=12.6.85'")
  have.update({"jax-cuda12-pjrt": "0.12.0.1", "jax-cuda12-plugin": "0.12.0.1",
               "nvidia-cuda-nvcc-cu12": "12.9.86"})
  assert wheels.problems() == []


def test_without_jaxlib_installed_plugin_wheels_are_not_called_mismatched(monkeypatch):
  # With no jaxlib there is no version to match: an installed plugin is not
  # reported as "does not match jaxlib " (an empty version).
  monkeypatch.setattr(compat, "JAXLIB_VERSION_TEXT", "")
  have = {"jax-cuda12-pjrt": "0.12.0.1", "jax-cuda12-plugin": "0.12.0.1",
          "nvidia-cuda-nvcc-cu12": "12.9.86"}
  monkeypatch.setattr(wheels, "_version", have.get)
  assert wheels.problems() == []
  del have["jax-cuda12-plugin"]
  assert wheels.problems() == ["jax-cuda12-plugin is not installed"]


def test_jax_starts_on_the_cpu_where_the_plugin_has_no_gpu(monkeypatch):
  from hlo_audit._src.target import specs as specs_mod

  monkeypatch.setattr(wheels, "libtpu_version", lambda: None)
  monkeypatch.setattr(specs_mod, "plugin_library", lambda: ("/x/xla_cuda_plugin.so", "p 1"))
  monkeypatch.setattr(wheels, "has_nvidia_gpu", lambda: False)
  env = {}
  assert wheels.cpu_unless_accelerator(env) and env == {"JAX_PLATFORMS": "cpu"}
  env = {"JAX_PLATFORMS": "cuda"}  # the user's choice stands
  assert not wheels.cpu_unless_accelerator(env) and env == {"JAX_PLATFORMS": "cuda"}
  monkeypatch.setattr(wheels, "has_nvidia_gpu", lambda: True)
  env = {}
  assert not wheels.cpu_unless_accelerator(env) and env == {}
  monkeypatch.setattr(wheels, "has_nvidia_gpu", lambda: False)
  monkeypatch.setattr(specs_mod, "plugin_library", lambda: None)
  assert not wheels.cpu_unless_accelerator(env) and env == {}


def test_jax_starts_on_the_cpu_where_libtpu_has_no_tpu(monkeypatch):
  from hlo_audit._src.target import specs as specs_mod

  monkeypatch.setattr(specs_mod, "plugin_library", lambda: None)
  monkeypatch.setattr(wheels, "libtpu_version", lambda: "0.0.42.1")
  monkeypatch.setattr(wheels, "has_tpu", lambda: False)
  env = {}
  assert wheels.cpu_unless_accelerator(env) and env == {"JAX_PLATFORMS": "cpu"}
  monkeypatch.setattr(wheels, "has_tpu", lambda: True)  # a TPU VM: its TPU runs
  env = {}
  assert not wheels.cpu_unless_accelerator(env) and env == {}
  # Both wheels, a GPU but no TPU: the GPU runs.
  monkeypatch.setattr(wheels, "has_tpu", lambda: False)
  monkeypatch.setattr(specs_mod, "plugin_library", lambda: ("/x/xla_cuda_plugin.so", "p 1"))
  monkeypatch.setattr(wheels, "has_nvidia_gpu", lambda: True)
  assert not wheels.cpu_unless_accelerator(env) and env == {}


def test_jaxlibs_import_logs_are_left_out_of_stderr_and_the_rest_kept(capfd):
  # Written by jaxlib 0.11's CUDA libraries to file descriptor 2 at `import
  # jax` on a machine without a GPU: a CLI error would be seven lines, not one.
  noise = (b"WARNING: All log messages before absl::InitializeLog() is called are written "
           b"to STDERR\n"
           b"I0000 00:00:1796192816.206629   21218 cudart_stub.cc:31] Could not find cuda "
           b"drivers on your machine, GPU will not be used.\n")
  with wheels._stderr_without(wheels._IMPORT_NOISE):
    os.write(2, noise + b"E0000 00:00:1.0 1 pjrt.cc:9] a real error\n" + noise + b"last\n")
  assert capfd.readouterr().err == "E0000 00:00:1.0 1 pjrt.cc:9] a real error\nlast\n"


def test_the_jax_import_keeps_what_fails(capfd):
  with pytest.raises(ZeroDivisionError):
    with wheels._stderr_without(wheels._IMPORT_NOISE):
      os.write(2, b"partial output\n")
      1 / 0  # noqa: B018
  assert capfd.readouterr().err == "partial output\n"


def test_without_the_cuda_plugin_the_quiet_import_leaves_jax_alone():
  # Only the plugin's libraries log at `import jax`; without them there is
  # nothing to filter, and a command that never needs JAX starts without it.
  code = ("import sys\n"
          "from hlo_audit._src.target import specs, wheels\n"
          "assert 'jax' not in sys.modules\n"
          "specs.plugin_library = lambda: None\n"
          "wheels.import_jax_quietly()\n"
          "print('jax' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout
  assert out.strip() == "False"

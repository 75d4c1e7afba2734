"""XLA:GPU dump folders written by jax 0.11.2 and 0.12 (deviceless compiles
for an H200, `scripts/capture_gpu_dumps.py`): they parse, and the audit of
each agrees with XLA's own reports in it. CPU-only: the dumps are fixtures."""

from __future__ import annotations

import json
import pathlib

import pytest

import hlo_audit
from hlo_audit._src.capture.dump import load_dump

ROOT = pathlib.Path(__file__).resolve().parent / "gpu_dumps"
FOLDERS = sorted(p for p in ROOT.glob("jax-*/*") if p.is_dir())


def _index(folder: pathlib.Path) -> dict:
  return json.loads((folder.parent / "index.json").read_text())


def test_fixtures_cover_both_jax_versions_and_programs():
  assert {p.parent.name for p in FOLDERS} >= {"jax-0.11.2", "jax-0.12.0.1"}
  assert {p.name for p in FOLDERS} == {"rnn_step", "dp_step_8gpu"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_gpu_dump_folder_audits(folder):
  dump = load_dump(str(folder))
  (module,) = dump.modules
  assert module.stage.endswith("gpu_after_optimizations") and module.platform == "gpu"
  text = pathlib.Path(module.text_path).read_text()
  if folder.name == "rnn_step":
    # The forms XLA's dumps print that `as_text()` does not.
    assert "#1" in text and "get-tuple-element" not in text
    assert "async-start(" in text and "fusion-start(" not in text
  r = hlo_audit.audit_hlo(str(folder))
  assert r.module.platform == "gpu" and r.module.xla_peak_source == "dump reports"
  assert r.kernels and r.xla_peak_bytes


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_peak_against_xla_gpus_buffer_assignment(folder):
  r = hlo_audit.audit_hlo(str(folder))
  footprint = _index(folder)["programs"][folder.name]["xla_footprint_bytes"]
  # The dump's buffer assignment is memory_analysis()'s footprint, give or
  # take constants.
  assert abs(r.xla_peak_bytes - footprint) <= 64
  gap = (r.peak_bytes - r.xla_peak_bytes) / r.xla_peak_bytes
  # The scan is a 97 KiB program: about ten 256-byte chunks of XLA's heap
  # (tiny values, pointer tables) are placed otherwise here: 2.6%.
  assert abs(gap) <= (0.03 if folder.name == "rnn_step" else 0.01), gap


def test_the_sharded_dump_holds_an_all_reduce_over_eight_gpus():
  for folder in FOLDERS:
    if folder.name == "dp_step_8gpu":
      r = hlo_audit.audit_hlo(str(folder))
      assert r.program.module.attributes.get("num_partitions") == "8"
      assert [(c.opcode, c.group_size) for c in r.collectives] == [("all-reduce", 8)]

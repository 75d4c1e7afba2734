"""The validation script validates and exits non-zero on failure."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, _ROOT / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_validate_script_passes_and_writes_results(tmp_path):
  script = _load("validate_kernels")
  out = tmp_path / "validate"
  status = script.run(["softmax"], ["nonfinite"], out=str(out))
  assert status == 0
  data = json.loads(out.with_suffix(".json").read_text())
  assert data["passed"] and data["rows"][0]["op"] == "softmax"
  assert "| softmax |" in out.with_suffix(".md").read_text()


def test_validate_script_fails_on_a_failing_op(monkeypatch):
  script = _load("validate_kernels")
  import pallas_kernels as pk
  real = pk.validate

  def failing(*args, **kwargs):
    report = real(*args, **kwargs)
    import dataclasses
    row = dataclasses.replace(report.rows[0], written=False)
    return dataclasses.replace(report, rows=(row,) + report.rows[1:])

  monkeypatch.setattr(pk, "validate", failing)
  assert script.run(["softmax"], ["nonfinite"]) == 1


def test_bench_script_writes_json_and_markdown(tmp_path):
  script = _load("bench_kernels")
  out = tmp_path / "bench"
  report = script.run(["softmax"], ["nonfinite"], out=str(out), repeats=1, warmup=0)
  data = json.loads(out.with_suffix(".json").read_text())
  assert data["interpret"] == report.interpret and len(data["rows"]) == 1
  assert "speedup" in out.with_suffix(".md").read_text()

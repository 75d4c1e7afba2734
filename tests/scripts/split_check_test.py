"""`.ci/split_check.py`: a test run 1 skips for want of run 2's extras must
be in run 2's results; other skips, and tests run 1 ran, need not be."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _check():
  spec = importlib.util.spec_from_file_location("split_check", ROOT / ".ci" / "split_check.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _junit(path, cases) -> str:
  """A pytest results file: {name: skip message, or None where it ran}."""
  rows = []
  for name, why in cases.items():
    skip = "" if why is None else f'<skipped type="pytest.skip" message="{why}"/>'
    rows.append(f'<testcase classname="tests.t_test" name="{name}">{skip}</testcase>')
  path.write_text(f'<testsuites><testsuite name="pytest">{"".join(rows)}</testsuite>'
                  "</testsuites>")
  return str(path)


@pytest.mark.parametrize("why", [
    "needs the CUDA plugin wheels (jax-cuda12-plugin is not installed)",
    "Ray is not installed (pip install 'hlo-audit[ray]')",
    "jax 0.10.2's Mosaic GPU has no interpret mode to validate kernels with",
    "triton 3.9.0 cannot read the Triton IR of jax 0.10.2",
])
def test_a_test_skipped_for_run_2s_extras_must_be_in_run_2(tmp_path, capsys, why):
  check = _check()
  run1 = _junit(tmp_path / "1.xml", {"a": why, "b": None})
  assert check.main(run1, _junit(tmp_path / "2.xml", {"b": None})) == 1
  assert "tests.t_test::a" in capsys.readouterr().err
  # Collected in run 2 is enough, even where run 2 skips it for another reason.
  assert check.main(run1, _junit(tmp_path / "3.xml", {"a": "cuDNN is not available"})) == 0


def test_skips_no_run_can_lift_and_tests_run_1_ran_need_not_be_in_run_2(tmp_path, capsys):
  check = _check()
  run1 = _junit(tmp_path / "1.xml", {"a": "needs a GPU (jax.default_backend() != 'gpu')",
                                     "b": None, "c": "Ray is not installed"})
  assert check.main(run1, _junit(tmp_path / "2.xml", {"c": None})) == 0
  assert "the 1 tests run 1 skips" in capsys.readouterr().out

"""The pytest plugin: snapshots of findings, written with --hlo-audit-update,
compared by class, shape, work and source line (not instruction names)."""

from __future__ import annotations

import importlib.metadata
import json
import os

import pytest

import hlo_audit
from hlo_audit._src.testing import snapshot as snap

pytest_plugins = ("pytester",)

PLUGIN = "hlo_audit._src.testing.plugin"

MODEL = '''
import jax, jax.numpy as jnp
S = jax.ShapeDtypeStruct
X, W, B = S((64, 128), jnp.float32), S((128, 256), jnp.float32), S((256,), jnp.float32)

def layer(x, w, b):
    return {body}

def test_layer(hlo_audit_snapshot):
    hlo_audit_snapshot(layer, X, W, B)
'''


@pytest.fixture
def run(pytester, monkeypatch):
  # The plugin explicitly (not through the entry point of whatever is installed).
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  # The subprocess imports this checkout's hlo_audit, whatever is installed.
  root = os.path.dirname(os.path.dirname(os.path.abspath(hlo_audit.__file__)))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

  def go(*args):
    return pytester.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider", *args)
  return go


def test_snapshot_is_written_then_matches_then_catches_an_unfused_epilogue(pytester, run):
  pytester.makepyfile(test_model=MODEL.format(body="jnp.tanh(x @ w + b)"))
  missing = run()
  missing.assert_outcomes(failed=1)
  # The missing file named from the project's root, where a user looks for it.
  missing.stdout.fnmatch_lines(["*no hlo-audit snapshot __hlo_audit__?test_model?test_layer.json: "
                                "run pytest --hlo-audit-update*"])
  run("--hlo-audit-update").assert_outcomes(passed=1)
  path = pytester.path / "__hlo_audit__" / "test_model" / "test_layer.json"
  stored = json.loads(path.read_text())
  assert [e["class"] for e in stored["findings"]] == ["unfused-epilogue"]
  assert stored["findings"][0]["source"] == "test_model.py:6"
  run().assert_outcomes(passed=1)
  # A second gap appears at the same line: the test names it.
  pytester.makepyfile(test_model=MODEL.format(
      body="jnp.tanh(jnp.tanh(x @ w + b) @ w.T)"))
  result = run()
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines(["*findings differ from __hlo_audit__*test_layer.json*",
                               "*appeared (2):*",
                               # x (f32[64,128]) dies before the new output of its
                               # shape is written: donating it would save memory.
                               "*+ undonated-argument f32?64,128? ?x? safe*at test_model.py:6",
                               "*+ unfused-epilogue f32?64,128? ?activation:tanh? safe*at test_model.py:6"])
  # A gap closed (no epilogue left: nothing to find) fails too: the
  # snapshot is out of date, and the test says what went.
  pytester.makepyfile(test_model=MODEL.format(body="x @ w"))
  closed = run()
  closed.assert_outcomes(failed=1)
  closed.stdout.fnmatch_lines(["*findings differ from __hlo_audit__*test_layer.json*",
                               "*gone (1):*", "*- unfused-epilogue f32?64,256?*"])
  assert "appeared" not in closed.stdout.str()


def test_a_snapshot_line_counts_a_finding_only_when_it_repeats():
  e = {"class": "unfused-epilogue", "shape": "f32[8]", "ops": ["tanh"], "verdict": "safe",
       "bytes_saved": 32, "source": "m.py:3"}
  assert snap.entry_line(e) == "unfused-epilogue f32[8] [tanh] safe 32 B at m.py:3"
  assert snap.entry_line({**e, "count": 1}) == snap.entry_line(e)
  assert snap.entry_line({**e, "count": 3}).startswith("unfused-epilogue x3 f32[8] ")


def test_matching_ignores_instruction_names():
  text = """HloModule m, is_scheduled=true
ENTRY %main (x: f32[64,64], w: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[64,64]{1,0} parameter(1)
  %d = f32[64,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={source_file="/m.py" source_line=3}
  ROOT %t = f32[64,64]{1,0} tanh(%d), metadata={source_file="/m.py" source_line=3}
}
"""
  renamed = text.replace("%d", "%dot.17").replace("%t ", "%tanh.3 ")
  a = snap.snapshot_of(hlo_audit.audit_hlo(text), "/")
  b = snap.snapshot_of(hlo_audit.audit_hlo(renamed), "/")
  assert a and a == b and snap.compare_snapshots(a, b) == ([], [])
  wider = snap.snapshot_of(hlo_audit.audit_hlo(text.replace("64,64", "64,128")), "/")
  appeared, gone = snap.compare_snapshots(a, wider)
  assert appeared and gone


def test_plugin_is_registered_by_an_entry_point():
  eps = importlib.metadata.entry_points(group="pytest11")
  mine = [e for e in eps if e.value == PLUGIN]
  if not mine:
    pytest.skip("hlo-audit is installed without this entry point (reinstall: pip install -e .)")
  assert mine[0].name == "hlo_audit" and mine[0].load().hlo_audit_snapshot

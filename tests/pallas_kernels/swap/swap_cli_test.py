"""`hlo-audit example --swap`: before/after audits, diff and verification."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from hlo_audit._src.cli import main

_SIZES = ["--set", "batch=2", "--set", "seq=16", "--set", "d_model=32", "--set", "heads=2",
          "--set", "d_ff=64", "--set", "vocab=64"]


def test_example_swap_json_forward_only():
  buf = io.StringIO()
  with redirect_stdout(buf):
    code = main.run(["example", *_SIZES, "--forward-only", "--swap", "--json"])
  assert code == main.ExitCode.OK
  d = json.loads(buf.getvalue())
  assert set(d) == {"swap", "before", "after", "diff", "verification"}
  assert d["verification"]["passed"] is True
  assert d["diff"]["launches_delta"] < 0
  # Six kernels run; at these sizes XLA unrolls one-step grids, and unrolled
  # kernels of one op that feed each other are grouped together.
  assert 3 <= d["after"]["kernels_by_kind"]["pallas kernel"] <= 6
  assert d["before"]["findings"]["unfused-epilogue"] > d["after"]["findings"].get(
      "unfused-epilogue", 0)
  replaced = [s for s in d["swap"]["sites"] if s["replaced"]]
  assert len(replaced) == 6


def test_example_swap_text_training_step():
  buf = io.StringIO()
  with redirect_stdout(buf):
    code = main.run(["example", *_SIZES, "--swap"])
  out = buf.getvalue()
  assert code == main.ExitCode.OK, out
  assert "before:" in out and "after:" in out and "findings gone" in out
  assert "verification (acceptance gate):" in out and "verdict: PASS" in out
  assert "not measured: interpret mode timings mean nothing" in out

"""`min_time`: the assertions' threshold on estimated time saved per step,
checked against fixed device facts so the estimates do not depend on this
machine (the time formatter and parser behind it: report/units_test.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import pytest

import hlo_audit
from hlo_audit import testing
from hlo_audit._src.analysis.records import with_changes
from hlo_audit._src.report.units import fmt_time
from hlo_audit._src.target.devices import DeviceFacts
from hlo_audit._src.testing import assertions
from hlo_audit._src.testing import snapshot as snap
from tests.hlo_audit.testing.assertions_test import GPU_FUSED, GPU_UNFUSED
from tests.hlo_audit.testing.plugin_test import PLUGIN

pytest_plugins = ("pytester",)

FACTS = DeviceFacts(name="test", description="a made-up device", platform="cpu",
                    memory_bandwidth=1e11, matrix_flops={"f32": 1e12},
                    vector_flops={"f32": 1e11}, transcendentals_per_second=1e10,
                    launch_overhead=1e-6)


def priced(text: str = GPU_UNFUSED):
  return hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device=FACTS))


def saved() -> float:
  """The one group's estimated time saved: the unfused GELU epilogue."""
  (group,) = [g for g in priced().groups if g.actionable]
  assert group.kind.slug == "unfused-epilogue" and group.time_saved > 0
  return group.time_saved


def test_groups_below_min_time_are_ignored_and_the_rest_listed_with_their_time():
  r, t = priced(), saved()
  assert r.timing.facts.name == "test"
  assert len(assertions.select(r, min_time=t)) == 1          # reaching it counts
  assert assertions.select(r, min_time=math.nextafter(t, 1.0)) == []
  testing.assert_no_findings(r, min_time="2us")             # 1.56 us is below 2 us
  testing.assert_no_findings(r, min_time=1e-6, min_bytes="1MiB")  # both thresholds hold
  with pytest.raises(AssertionError) as e:
    testing.assert_no_findings(r, min_time="1us")
  msg = str(e.value)
  assert "1 finding(s) (unfused-epilogue) in 1 group(s) saving at least 1.00 us per step " \
         "on test" in msg, msg
  head, row = msg.splitlines()[1:3]
  assert "time" in head.split() and "saves" in head.split()
  assert fmt_time(t) == "1.56 us"
  assert re.match(r"\s*1\s+1\.56 us\s.*64\.00 KiB\s+unfused epilogue", row), row


def test_min_time_without_an_estimate_fails_instead_of_passing():
  unpriced = hlo_audit.audit_hlo(GPU_UNFUSED)
  assert unpriced.timing is None
  with pytest.raises(AssertionError, match=r"min_time='1us' cannot be checked: the audit "
                     r"estimated no time: the device is unknown"):
    testing.assert_no_findings(unpriced, min_time="1us")
  # Even where no group would be listed: the threshold itself is unchecked.
  fused = hlo_audit.audit_hlo(GPU_FUSED)
  testing.assert_no_findings(fused)
  with pytest.raises(AssertionError, match="cannot be checked"):
    testing.assert_no_findings(fused, min_time=0.0)
  with pytest.raises(AssertionError, match="cannot be checked"):
    testing.assert_no_copies(fused, min_time="1us")
  with pytest.raises(AssertionError, match="cannot be checked"):
    assertions.select(fused, min_time="1ms")


def test_bad_min_time_text_is_a_value_error_even_without_an_estimate():
  for report in (priced(), hlo_audit.audit_hlo(GPU_FUSED)):
    with pytest.raises(ValueError, match="'fast' is not a time"):
      testing.assert_no_findings(report, min_time="fast")


def test_a_group_the_model_could_not_price_is_kept():
  r = priced()
  unpriced = dataclasses.replace(
      r, findings=tuple(with_changes(f, time_saved=None) for f in r.findings))
  (group,) = assertions.select(unpriced, min_time="1s")
  assert group.time_saved is None
  with pytest.raises(AssertionError, match="unfused epilogue"):
    testing.assert_no_findings(unpriced, min_time="1s")


def test_snapshots_leave_out_groups_below_min_time_and_store_no_times():
  r, t = priced(), saved()
  kept = snap.snapshot_of(r, "/", min_time=t)
  assert [e["class"] for e in kept] == ["unfused-epilogue"]
  assert all("time_saved" not in e for e in kept)
  assert snap.snapshot_of(r, "/", min_time=math.nextafter(t, 1.0)) == []
  with pytest.raises(AssertionError, match="cannot be checked"):
    snap.snapshot_of(hlo_audit.audit_hlo(GPU_FUSED), "/", min_time="1us")


TESTS = f'''
import hlo_audit
TEXT = {GPU_UNFUSED!r}

def test_unknown_device(hlo_audit_snapshot):
    hlo_audit_snapshot(hlo_audit.audit_hlo(TEXT), min_time="1us")

def test_priced(hlo_audit_snapshot):
    hlo_audit_snapshot(hlo_audit.audit_hlo(TEXT, options=hlo_audit.AuditOptions(device="h200")),
                       min_time="1s")
'''


def test_the_fixture_carries_min_time(pytester, monkeypatch):
  root = os.path.dirname(os.path.dirname(os.path.abspath(hlo_audit.__file__)))
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  monkeypatch.setenv("PYTHONPATH", root)
  pytester.makepyfile(test_model=TESTS)
  result = pytester.runpytest_subprocess("-p", PLUGIN, "-p", "no:cacheprovider",
                                         "--hlo-audit-update")
  result.assert_outcomes(passed=1, failed=1)
  result.stdout.fnmatch_lines(["*min_time='1us' cannot be checked*"])
  stored = json.loads((pytester.path / "__hlo_audit__" / "test_model" /
                       "test_priced.json").read_text())
  # The epilogue saves microseconds on an H200, not a second: left out.
  assert stored["findings"] == []

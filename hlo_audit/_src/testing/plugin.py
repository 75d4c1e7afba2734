"""The pytest plugin (entry point `pytest11: hlo_audit`): the
`hlo_audit_snapshot` fixture and the `--hlo-audit-update` option.

    def test_model_findings(hlo_audit_snapshot):
      hlo_audit_snapshot(model, x, w)     # compares with the stored snapshot

The snapshot lives beside the test, in
`__hlo_audit__/<test file>/<test name>.json`; `pytest --hlo-audit-update`
writes it. A finding group that appears or vanishes fails the test with both
lists; groups are matched by class, shape, work and source line, never by
XLA's instruction names.
"""

from __future__ import annotations

import os
import re

import pytest

from hlo_audit._src.testing import snapshot as snap


def pytest_addoption(parser):
  group = parser.getgroup("hlo-audit")
  group.addoption("--hlo-audit-update", action="store_true", default=False,
                  help="rewrite the hlo_audit_snapshot files from this run's audits")


def snapshot_path(node, name: str | None = None) -> str:
  test_file = str(node.path)
  stem = os.path.splitext(os.path.basename(test_file))[0]
  test = re.sub(r"[^A-Za-z0-9_.-]+", "_", node.name).strip("_")
  if name:
    test += "." + re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
  return os.path.join(os.path.dirname(test_file), "__hlo_audit__", stem, test + ".json")


@pytest.fixture
def hlo_audit_snapshot(request):
  """Audits a function (or takes a report) and compares its finding groups
  with the test's stored snapshot; returns the report. Keywords: `name`
  (several snapshots in one test), `min_bytes` and `min_time` (ignore
  groups saving less: "1MiB", "5us"; `min_time` fails the test when the
  audit has no time estimate), `target` (compile for that GPU: "h200", a
  `hlo_audit.Target`)."""
  from hlo_audit._src.testing.assertions import audited

  update = request.config.getoption("hlo_audit_update")
  root = str(request.config.rootpath)

  def check(fn_or_report, *args, name: str | None = None, min_bytes=0, target=None,
            min_time=None):
    __tracebackhide__ = True  # pytest shows the test's line, not ours
    report = audited(fn_or_report, *args, target=target).report
    current = snap.snapshot_of(report, root, min_bytes, min_time)
    path = snapshot_path(request.node, name)
    if update:
      snap.write_snapshot(path, report.module.name, current)
      return report
    if not os.path.exists(path):
      pytest.fail(f"no hlo-audit snapshot {os.path.relpath(path, root)}: run pytest "
                  "--hlo-audit-update to write it", pytrace=False)
    appeared, gone = snap.compare_snapshots(snap.read_snapshot(path), current)
    if appeared or gone:
      lines = [f"{report.module.name}: findings differ from {os.path.relpath(path, root)} "
               "(pytest --hlo-audit-update accepts them)"]
      if appeared:
        lines += [f"appeared ({len(appeared)}):"] + ["  + " + snap.entry_line(e) for e in appeared]
      if gone:
        lines += [f"gone ({len(gone)}):"] + ["  - " + snap.entry_line(e) for e in gone]
      pytest.fail("\n".join(lines), pytrace=False)
    return report

  return check

"""`hlo-audit ... --swap --json`: the before/after summaries count what the
audits hold."""

from __future__ import annotations

import types

from hlo_audit import FindingKind
from hlo_audit._src.cli.swap_cmd import _summary_dict


def _report(*kinds):
  findings = [types.SimpleNamespace(kind=k) for k in kinds]
  return types.SimpleNamespace(
      findings=findings, module=types.SimpleNamespace(name="m", target=None, platform="cpu"),
      kernels=(), kernels_by_kind=lambda: {}, peak_bytes=0, materialized_bytes=0,
      bytes_saved=0)


def test_findings_are_counted_per_class():
  e, r = FindingKind.UNFUSED_EPILOGUE, FindingKind.SEPARATE_REDUCTION
  d = _summary_dict(_report(e, r, e))
  assert d["findings"] == {e.slug: 2, r.slug: 1}
  assert _summary_dict(_report())["findings"] == {}

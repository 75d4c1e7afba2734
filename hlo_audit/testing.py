"""Assertions for tests and CI: keep a program's fusions once they are won.

    from hlo_audit import testing

    def test_mlp_stays_fused():
      testing.assert_fused(mlp, x, w, b, op="gelu", into="dot")
      testing.assert_no_findings(mlp, x, w, b, kinds="unfused-epilogue", min_bytes="1MiB")

Failures raise AssertionError listing the offending finding groups with their
source lines. The pytest plugin (installed with hlo-audit) adds the
`hlo_audit_snapshot` fixture and the `--hlo-audit-update` option.
"""

from hlo_audit._src.testing.assertions import OP_SIGNATURES as OP_SIGNATURES
from hlo_audit._src.testing.assertions import assert_fused as assert_fused
from hlo_audit._src.testing.assertions import assert_kernel_count as assert_kernel_count
from hlo_audit._src.testing.assertions import assert_no_copies as assert_no_copies
from hlo_audit._src.testing.assertions import assert_no_findings as assert_no_findings
from hlo_audit._src.testing.assertions import assert_peak_below as assert_peak_below
from hlo_audit._src.testing.snapshot import snapshot_of as snapshot_of
from hlo_audit._src.testing.snapshot import compare_snapshots as compare_snapshots

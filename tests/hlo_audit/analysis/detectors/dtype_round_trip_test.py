"""A dtype round trip split over two convert kernels: widening first gives
the values back, narrowing first rounds them; the verdicts differ."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit import FindingKind, NumericalClass, Verdict

# %c converts x from SRC to MID, %f converts it back to SRC: two kernels,
# each only a conversion.
MODULE = """
HloModule rt, is_scheduled=true

%fused_there (p0: SRC[256,512]) -> MID[256,512] {
  %p0 = SRC[256,512]{1,0} parameter(0)
  ROOT %t = MID[256,512]{1,0} convert(%p0)
}

%fused_back (p0: MID[256,512]) -> SRC[256,512] {
  %p0 = MID[256,512]{1,0} parameter(0)
  ROOT %b = SRC[256,512]{1,0} convert(%p0)
}

ENTRY %main (x: SRC[256,512]) -> SRC[256,512] {
  %x = SRC[256,512]{1,0} parameter(0)
  %c = MID[256,512]{1,0} fusion(%x), kind=kLoop, calls=%fused_there
  ROOT %f = SRC[256,512]{1,0} fusion(%c), kind=kLoop, calls=%fused_back
}
"""


def _trip(src: str, mid: str) -> hlo_audit.FusionDecisionRecord:
  report = hlo_audit.audit_hlo(MODULE.replace("SRC", src).replace("MID", mid))
  (c,) = [f for f in report.findings_of(FindingKind.STANDALONE_COPY) if f.boundary == "c"]
  assert (c.producer, c.consumers, c.ops) == ("c", ("f",), ("convert round trip",))
  return c


@pytest.mark.parametrize("src,mid", [("bf16", "f32"), ("f16", "f32"), ("bf16", "f64")])
def test_widening_then_narrowing_back_is_lossless(src, mid):
  trip = _trip(src, mid)
  assert trip.verdict is Verdict.SAFE
  assert trip.numerical_class is NumericalClass.EXACT
  assert "the values are unchanged" in trip.evidence, trip.evidence
  assert not any("rounding" in r or "rounds" in r for r in trip.reasons), trip.reasons


@pytest.mark.parametrize("src,mid", [("f32", "bf16"), ("f32", "f16"), ("f64", "f32")])
def test_narrowing_then_widening_back_loses_precision(src, mid):
  trip = _trip(src, mid)
  assert trip.verdict is Verdict.RISKY
  assert trip.numerical_class is NumericalClass.PRECISION_CHANGE
  assert f"c rounds to {mid}" in trip.evidence, trip.evidence
  assert "unchanged" not in trip.evidence, trip.evidence
  assert not any("value-preserving" in r for r in trip.reasons), trip.reasons

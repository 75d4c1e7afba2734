"""XLA's own estimate of a step made readable: libtpu's -1 s per op it
cannot price undone, and XLA:TPU's per-kernel cycles set beside our seconds."""

from __future__ import annotations

import pytest

from hlo_audit._src.analysis import xla_estimate
from hlo_audit._src.hlo.parser import parse_hlo

# Two ConcatBitcasts, as XLA:TPU joins the slices it staged on chip.
_CONCAT = """HloModule m, is_scheduled=true

ENTRY %e (p: f32[256,128]) -> f32[256,128] {
  %p = f32[256,128]{1,0} parameter(0)
  %a = f32[128,128]{1,0} slice(%p), slice={[0:128], [0:128]}
  %b = f32[128,128]{1,0} slice(%p), slice={[128:256], [0:128]}
  %c = f32[256,128]{1,0} custom-call(%a, %b), custom_call_target="ConcatBitcast"
  %d = f32[128,128]{1,0} slice(%c), slice={[0:128], [0:128]}
  %e = f32[128,128]{1,0} slice(%c), slice={[128:256], [0:128]}
  ROOT %f = f32[256,128]{1,0} custom-call(%d, %e), custom_call_target="ConcatBitcast"
}
"""


def test_libtpus_minus_one_per_concat_bitcast_is_undone():
  module = parse_hlo(_CONCAT)
  est = xla_estimate.libtpu_step({"optimal_seconds": -1.99986}, module)
  assert est.uncosted == 2
  assert est.seconds == pytest.approx(1.4e-4, rel=1e-6)
  assert est.reported == -1.99986


def test_a_total_the_count_does_not_explain_gives_no_estimate():
  module = parse_hlo(_CONCAT)
  assert xla_estimate.libtpu_step({"optimal_seconds": -2.5}, module) is None
  assert xla_estimate.libtpu_step({"flops": 1.0}, module) is None
  assert xla_estimate.libtpu_step(None, module) is None
  assert xla_estimate.libtpu_step({}, module) is None
  # Exactly two seconds under: two uncosted ops and no work at all.
  assert xla_estimate.libtpu_step({"optimal_seconds": -2.0}, module).seconds == 0.0


def test_a_positive_total_without_concat_bitcasts_stands():
  module = parse_hlo(_CONCAT.replace("ConcatBitcast", "SomethingElse"))
  est = xla_estimate.libtpu_step({"optimal_seconds": 3e-3}, module)
  assert (est.seconds, est.reported, est.uncosted) == (3e-3, 3e-3, 0)


def test_the_cycles_spread_is_relative_to_the_median():
  cycles = {f"k{i}": 1000 for i in range(10)}
  seconds = {f"k{i}": 1e-6 for i in range(10)}
  seconds["k0"] = 4e-6  # one kernel we price 4x higher than XLA:TPU does
  s = xla_estimate.cycles_spread(cycles, seconds)
  assert s.kernels == 10
  assert s.seconds_per_cycle == pytest.approx(1e-9)
  assert s.low == pytest.approx(1.0) and s.high == pytest.approx(1.3)
  assert xla_estimate.cycles_spread({"k": 5}, {"k": 1e-6}) is None


def test_the_spread_leaves_out_kernels_either_side_cannot_price():
  cycles = {"a": 100, "b": 200, "c": 400, "free": 0, "unknown": 50, "only_ours": 10}
  seconds = {"a": 1e-7, "b": 4e-7, "c": 4e-7, "free": 1e-6, "unknown": 0.0}
  s = xla_estimate.cycles_spread(cycles, seconds)
  # Ratios 1e-9, 2e-9, 1e-9 (ns per cycle): "free", "unknown" and
  # "only_ours" (no seconds of ours) are not priced by both.
  assert s.kernels == 3
  assert s.seconds_per_cycle == pytest.approx(1e-9)
  assert s.low == pytest.approx(1.0) and s.high == pytest.approx(1.8)
  # Two kernels priced by both are too few to spread.
  del cycles["c"]
  assert xla_estimate.cycles_spread(cycles, seconds) is None


def test_estimated_cycles_are_read_from_the_window_config():
  text = _CONCAT.replace(
      '%a = f32[128,128]{1,0} slice(%p), slice={[0:128], [0:128]}',
      '%a = f32[128,128]{1,0} slice(%p), slice={[0:128], [0:128]}, '
      'backend_config={"window_config":{"estimated_cycles":"1828"}}').replace(
      '%d = f32[128,128]{1,0} slice(%c), slice={[0:128], [0:128]}',
      '%d = f32[128,128]{1,0} slice(%c), slice={[0:128], [0:128]}, '
      'backend_config={"estimated_cycles":"7"}').replace(
      '%e = f32[128,128]{1,0} slice(%c), slice={[128:256], [0:128]}',
      '%e = f32[128,128]{1,0} slice(%c), slice={[128:256], [0:128]}, '
      'backend_config="estimated_cycles: not json"')
  # `d` names the field outside a window config; `e`'s config is no JSON.
  assert xla_estimate.estimated_cycles(parse_hlo(text)) == {"a": 1828}

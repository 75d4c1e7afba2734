"""The block-size arithmetic the ops share, and how a config gives up
pipeline stages to fit shared memory."""

from __future__ import annotations

import dataclasses

import pytest

from pallas_kernels._src.ops import tiling


@pytest.mark.parametrize("n, pow2, nxt", [(1, True, 1), (2, True, 2), (3, False, 4),
                                          (64, True, 64), (65, False, 128), (0, False, 1)])
def test_powers_of_two(n, pow2, nxt):
  assert tiling.is_pow2(n) is pow2 and tiling.next_pow2(n) == nxt


@dataclasses.dataclass(frozen=True)
class _Cfg:
  num_stages: int


@pytest.mark.parametrize("budget, stages", [(300, 3), (299, 2), (200, 2), (199, 1), (0, 1)])
def test_stages_are_shed_one_at_a_time_to_fit_and_never_below_one(budget, stages):
  # 100 bytes a stage: three fit 300, two fit 200; one is kept whatever.
  assert tiling.fit_stages(_Cfg(3), lambda c: 100 * c.num_stages, budget) == _Cfg(stages)

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


@pytest.mark.parametrize("value", [True, 64.0, "64", None])
def test_a_block_size_or_warp_count_is_an_int(value):
  # True is Python's 1, a power of two: as a warp count it is a typo.
  assert not tiling.is_pow2(value)


def _configs():
  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.ops.adam_matmul import config as adam
  from pallas_kernels._src.ops.batch_norm import config as batch_norm
  from pallas_kernels._src.ops.conv2d import config as conv2d
  from pallas_kernels._src.ops.conv2d_weight_grad import config as conv2d_wg
  from pallas_kernels._src.ops.glu_matmul import config as glu
  from pallas_kernels._src.ops.group_norm import config as group_norm
  from pallas_kernels._src.ops.linear_cross_entropy import config as lce
  from pallas_kernels._src.ops.matmul import config as matmul
  from functools import partial
  return [adam.Config, batch_norm.Config, conv2d.Config, conv2d_wg.Config, glu.Config,
          group_norm.Config, partial(lce.Config, block_t=16, block_v=128), matmul.Config,
          matmul.BackwardConfig]


@pytest.mark.parametrize("config", _configs(), ids=lambda c: getattr(c, "func", c).__module__)
def test_every_triton_config_refuses_a_bool_warp_count(config):
  with pytest.raises(ValueError, match="num_warps"):
    config(num_warps=True)


@pytest.mark.parametrize("stages", [0, 1.0])
def test_the_glu_config_takes_a_whole_number_of_stages_from_one(stages):
  from pallas_kernels._src.ops.glu_matmul.config import Config  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="num_stages must be >= 1"):
    Config(num_stages=stages)


@dataclasses.dataclass(frozen=True)
class _Cfg:
  num_stages: int


@pytest.mark.parametrize("budget, stages", [(300, 3), (299, 2), (200, 2), (199, 1), (0, 1)])
def test_stages_are_shed_one_at_a_time_to_fit_and_never_below_one(budget, stages):
  # 100 bytes a stage: three fit 300, two fit 200; one is kept whatever.
  assert tiling.fit_stages(_Cfg(3), lambda c: 100 * c.num_stages, budget) == _Cfg(stages)

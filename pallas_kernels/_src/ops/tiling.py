"""Power-of-two arithmetic the ops' block-size rules share (Triton tensors
and Pallas blocks want power-of-two extents), and how their configs give up
pipeline stages to fit shared memory."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import math
from typing import TypeVar

_Config = TypeVar("_Config")


def is_pow2(n: int) -> bool:
  """Whether `n` is an int (not a bool, which Python counts as one) and a
  positive power of two: what every block size and warp count must be."""
  return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and (n & (n - 1)) == 0


def next_pow2(n: int) -> int:
  """Smallest power of two >= max(n, 1)."""
  return 1 << max(0, math.ceil(math.log2(max(1, n))))


def fit_stages(cfg: _Config, smem: Callable[[_Config], int], budget: int) -> _Config:
  """`cfg` with pipeline stages shed, one at a time, until its shared memory
  `smem(cfg)` fits `budget`; never below one stage (the guard refuses what
  still does not fit)."""
  while cfg.num_stages > 1 and smem(cfg) > budget:
    cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
  return cfg

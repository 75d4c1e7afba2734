"""Power-of-two arithmetic the ops' block-size rules share (Triton tensors
and Pallas blocks want power-of-two extents)."""

from __future__ import annotations

import math


def is_pow2(n: int) -> bool:
  """Whether `n` is a positive power of two."""
  return n >= 1 and (n & (n - 1)) == 0


def next_pow2(n: int) -> int:
  """Smallest power of two >= max(n, 1)."""
  return 1 << max(0, math.ceil(math.log2(max(1, n))))

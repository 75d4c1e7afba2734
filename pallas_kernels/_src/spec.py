"""What every op tells `validate` and `bench` about itself.

Each op folder's `arg_specs.py` builds one `OpSpec`; `registry.py` lists them.
Validation and benchmarks are written once against this interface, so a new op
gets both for free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
  """One concrete call of an op: arrays, keyword options, and tags."""

  #: Short readable id, e.g. "x=bf16[7,129] w=bf16[129,33] gelu+bias".
  name: str
  #: Positional array arguments (already on device, random normal, never zeros).
  args: tuple[Any, ...]
  #: Keyword options of the public op (activation=..., eps=..., ...).
  kwargs: Mapping[str, Any]
  #: Tags that select cases: "ci" (fast, interpret-friendly), "bench" (realistic
  #: sizes), "grad" (also check gradients), "nonfinite" (inputs hold NaN/Inf).
  tags: frozenset[str] = frozenset()
  #: Positions in `args` that gradients are checked for.
  grad_argnums: tuple[int, ...] = ()
  #: A case that exists to exercise a designed fallback names part of the
  #: reason it must record (e.g. "backward: out_dtype"); with kernels required
  #: it passes only if exactly that fallback happened. Empty: none allowed.
  expect_fallback: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class OpSpec:
  """An op as validation and benchmarking see it."""

  #: Public name in `pallas_kernels`, e.g. "matmul".
  name: str
  #: Calls the op: fn(*args, implementation=..., **kwargs), where
  #: implementation is "pallas" or "xla" (the reference).
  fn: Callable[..., Any]
  #: The reference at float32 and Precision.HIGHEST: the ground truth.
  reference_f32: Callable[..., Any]
  #: Yields cases for a tag, deterministically from the integer seed.
  cases: Callable[[str, int], Iterator[Case]]
  #: Logical bytes the op must read and write for a case (for GB/s and roofline).
  bytes_moved: Callable[[Case], int]
  #: Floating-point operations for a case (for TFLOP/s).
  flops: Callable[[Case], int]
  #: What `bench` times the kernel against: the same user-level computation as
  #: XLA gets it from plain jnp (fn(*args, **kwargs)); None: `fn` with
  #: implementation="xla", when that already is what a user would write.
  baseline: Callable[..., Any] | None = None

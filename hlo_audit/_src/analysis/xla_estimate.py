"""XLA's own estimate of the step, to set beside the time model's.

libtpu's `cost_analysis()` gives `optimal_seconds` for a whole module, and
XLA:TPU writes its per-kernel estimate into each fusion's backend config
(`"estimated_cycles"`). Two things make them unfit to print as they are:

- `optimal_seconds` adds -1 for each op libtpu's cost model cannot price:
  a `ConcatBitcast` custom call (which joins the slices XLA staged on
  chip) reads as -1 s. A module with two of them and 135 us of work reports
  -1.99986. `libtpu_step` counts those ops and undoes it.
- `estimated_cycles` are cycles of a clock neither XLA nor Google's pages
  state for every generation, so the comparison is of ratios: each kernel's
  seconds in our model over its cycles, spread around their median
  (`cycles_spread`). A kernel both price alike sits at 1.0.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping

from hlo_audit._src.hlo.ir import HloModule

#: Custom-call targets libtpu's cost model prices at -1 s each (seen in
#: libtpu 0.0.42 and 0.0.50: `optimal_seconds` is the module's time less one
#: per such call).
UNCOSTED_TARGETS = frozenset({"ConcatBitcast"})


@dataclasses.dataclass(frozen=True, slots=True)
class XlaEstimate:
  """libtpu's estimate of one step, made readable."""

  #: Seconds, with the -1 per op it could not price undone.
  seconds: float
  #: `optimal_seconds` as `cost_analysis()` reported it.
  reported: float
  #: Ops priced at -1 s (their count).
  uncosted: int


def libtpu_step(cost_analysis: Mapping[str, float] | None,
                module: HloModule) -> XlaEstimate | None:
  """libtpu's `optimal_seconds` of `module` with its -1 per uncosted op
  undone; None where there is none, or where the count does not account
  for a negative total (an op priced at -1 this table lacks)."""
  if not cost_analysis or "optimal_seconds" not in cost_analysis:
    return None
  reported = float(cost_analysis["optimal_seconds"])
  uncosted = sum(1 for comp in module.computations for inst in comp.instructions
                 if inst.opcode == "custom-call"
                 and inst.custom_call_target in UNCOSTED_TARGETS)
  seconds = reported + uncosted
  if seconds < 0:
    return None
  return XlaEstimate(seconds=seconds, reported=reported, uncosted=uncosted)


def estimated_cycles(module: HloModule) -> dict[str, int]:
  """XLA:TPU's per-kernel estimate: instruction name -> `estimated_cycles`
  from its backend config's `window_config`."""
  out = {}
  for comp in module.computations:
    for inst in comp.instructions:
      config = inst.backend_config
      if not config or "estimated_cycles" not in config:
        continue
      try:
        cycles = json.loads(config).get("window_config", {}).get("estimated_cycles")
      except (ValueError, AttributeError):
        continue
      if cycles is not None:
        out[inst.name] = int(cycles)
  return out


@dataclasses.dataclass(frozen=True, slots=True)
class CyclesSpread:
  """How our per-kernel seconds track XLA:TPU's `estimated_cycles`."""

  #: Kernels both price (cycles > 0, our time > 0).
  kernels: int
  #: Our seconds per XLA cycle, the median over those kernels: the clock
  #: the two agree at is its inverse.
  seconds_per_cycle: float
  #: The 10th and 90th percentile of each kernel's ratio over the median.
  low: float
  high: float


def cycles_spread(cycles: Mapping[str, int],
                  seconds: Mapping[str, float]) -> CyclesSpread | None:
  """The spread of seconds/cycles over kernels in both tables; None with
  fewer than three."""
  ratios = sorted(seconds[n] / c for n, c in cycles.items()
                  if c > 0 and seconds.get(n, 0.0) > 0)
  if len(ratios) < 3:
    return None
  median = statistics.median(ratios)
  q = statistics.quantiles(ratios, n=10, method="inclusive")
  return CyclesSpread(kernels=len(ratios), seconds_per_cycle=median,
                      low=q[0] / median, high=q[-1] / median)

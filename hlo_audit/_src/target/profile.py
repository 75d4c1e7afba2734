"""Kernel times measured on this machine's device, from JAX's profiler.

`profile_kernels(compiled, *args)` runs a compiled function under
`jax.profiler` several times and reads the trace it writes: XLA names each
kernel's event after the HLO instruction that launches it (`hlo_op`, with
the module's name in `hlo_module` and the execution in `run_id`), on XLA:CPU
and XLA:GPU alike. What comes back is per kernel the median over runs of its
time in one run (a kernel in a loop runs many times; `kernel_profile` says
how kernels that finish after their event are timed), and per run the span
from its first kernel's start to its end: the step as the device saw it,
without Python's dispatch.

The calibration of this machine's CPU (`calibration.py`) and the time
model's benchmark (scripts/bench_time_model.py) read kernel times this way.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import statistics
import tempfile
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from hlo_audit._src.errors import HloAuditError


@dataclasses.dataclass(frozen=True, slots=True)
class KernelProfile:
  """Measured kernel times of one module, over several runs."""

  #: The HLO module's name, e.g. "jit_train_step".
  module: str
  #: Runs profiled.
  runs: int
  #: Kernel (HLO instruction) name -> median seconds it took per run (its
  #: events in one run summed: a kernel in a loop runs many times).
  kernel_times: Mapping[str, float]
  #: Kernel name -> events per run (the launches, a loop's included).
  launches: Mapping[str, int]
  #: Kernel name -> its seconds in each run that ran it.
  kernel_runs: Mapping[str, tuple[float, ...]]
  #: Per run: seconds from its first kernel's start to its last kernel's end.
  step_times: tuple[float, ...]

  @property
  def step_time(self) -> float:
    """Median seconds of one run on the device."""
    return statistics.median(self.step_times) if self.step_times else 0.0

  @property
  def kernel_time(self) -> float:
    """Seconds the kernels themselves took per run (median per kernel,
    summed): the step less the gaps between kernels."""
    return sum(self.kernel_times.values())


def read_trace_events(trace_dir: str) -> list[dict]:
  """The complete ("X") events of the Perfetto trace JSON that
  `jax.profiler.trace(..., create_perfetto_trace=True)` wrote under
  `trace_dir`.

  Raises:
    HloAuditError: when no trace was written or it cannot be read.
  """
  found = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                           recursive=True))
  if not found:
    raise HloAuditError(f"no perfetto_trace.json.gz under {trace_dir}: the profiler "
                        "wrote no trace")
  try:
    with gzip.open(found[-1], "rt", encoding="utf-8") as f:
      doc = json.load(f)
  except (OSError, ValueError) as e:
    raise HloAuditError(f"cannot read the profiler's trace {found[-1]}: {e}") from None
  events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
  return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


#: The event XLA:CPU's executor records for a run while it waits for the
#: run's last kernel (an asynchronous one's work included) to finish.
_RUN_WAIT = "ThunkExecutor::Execute (wait for completion)"


def kernel_profile(events: Sequence[Mapping[str, Any]], module: str,
                   kernels: Sequence[str] | None = None,
                   asynchronous: Collection[str] | bool = ()) -> KernelProfile:
  """Per-kernel and per-run times of `module` from trace events (`kernels`:
  the instruction names to keep; default every `hlo_op` of the module).

  Events of one execution share a `run_id` (else a `group_id`; events with
  neither count as one run); runs with no kernel event of the module are
  not counted. XLA:CPU runs some kernels asynchronously: an Eigen dot's or
  convolution's event ends when it has handed its work to the thread pool,
  and what depends on it starts when that work is done. The time of a kernel
  named in `asynchronous` (True: every kernel) therefore runs from its
  event's start to the next kernel's start where that is later than its
  event's end, the last one's to the run's end (the executor's wait for
  completion, where recorded).
  """
  wanted = None if kernels is None else frozenset(kernels)
  by_run: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
  waits: dict[str, float] = {}
  for e in events:
    args = e.get("args") or {}
    op, mod = args.get("hlo_op"), args.get("hlo_module")
    ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
    if not op:
      if e.get("name") == _RUN_WAIT and args.get("run_id") is not None:
        waits[args["run_id"]] = max(waits.get(args["run_id"], 0.0), ts + dur)
      continue
    # XLA:CPU tags a kernel's event with its execution's run_id; a device's
    # activity may carry only the group_id of the step that launched it.
    run = args.get("run_id", args.get("group_id", ""))
    if mod != module or (wanted is not None and op not in wanted):
      continue
    by_run[run].append((ts, ts + dur, op))
  per_run: dict[str, dict[str, float]] = {}
  count: dict[str, dict[str, int]] = {}
  steps = []
  for run in sorted(by_run):
    spans = sorted(by_run[run])
    end = max(max(e for _, e, _ in spans), waits.get(run, 0.0))
    times: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for i, (ts, te, op) in enumerate(spans):
      if asynchronous is True or op in asynchronous:
        te = max(te, spans[i + 1][0] if i + 1 < len(spans) else waits.get(run, te))
      times[op] += te - ts
      counts[op] += 1
    per_run[run], count[run] = times, counts
    steps.append((end - spans[0][0]) * 1e-6)
  runs = sorted(per_run)
  names = sorted({op for r in runs for op in per_run[r]})
  # Trace times are microseconds.
  each = {op: tuple(per_run[r][op] * 1e-6 for r in runs if op in per_run[r])
          for op in names}
  times = {op: statistics.median(per_run[r].get(op, 0.0) for r in runs) * 1e-6
           for op in names}
  launches = {op: max(count[r].get(op, 0) for r in runs) for op in names}
  return KernelProfile(module=module, runs=len(runs),
                       kernel_times=types.MappingProxyType(times),
                       launches=types.MappingProxyType(launches),
                       kernel_runs=types.MappingProxyType(each), step_times=tuple(steps))


def profile_kernels(compiled: Any, *args: Any, runs: int = 5, warmup: int = 2,
                    kernels: Sequence[str] | None = None,
                    module: str | None = None,
                    fresh_args: Callable[[], tuple] | None = None,
                    asynchronous: Collection[str] | bool = ()) -> KernelProfile:
  """Runs `compiled` (a `jax.stages.Compiled`, or any callable running one
  module) `warmup` times, then `runs` times under the profiler, and returns
  what the trace says of its kernels.

  Args:
    compiled: what to run; its module's name is read from
      `compiled.as_text()` unless `module` gives it.
    *args: its arguments (arrays on the device).
    runs: profiled runs; medians are over these.
    warmup: unprofiled runs first (allocations, caches).
    kernels: the instruction names to keep (default: every kernel event).
    module: the HLO module's name in the trace.
    fresh_args: makes the arguments of each run instead of `args` (a
      program that donates them consumes its arguments).
    asynchronous: kernels whose work outlasts their event (`kernel_profile`).

  Raises:
    HloAuditError: when the profiler writes no trace or records no kernel
      of the module.
  """
  import jax

  if module is None:
    text = compiled.as_text() if hasattr(compiled, "as_text") else ""
    first = text.split(None, 2)
    if len(first) < 2 or first[0] != "HloModule":
      raise HloAuditError("profile_kernels: pass module= for a callable without as_text()")
    module = first[1].rstrip(",")
  def arguments() -> tuple:
    return args if fresh_args is None else jax.block_until_ready(fresh_args())

  for _ in range(warmup):
    jax.block_until_ready(compiled(*arguments()))
  with tempfile.TemporaryDirectory(prefix="hlo-audit-profile-") as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(runs):
        # Made before the run: a run's span holds its kernels alone.
        call_args = arguments()
        jax.block_until_ready(compiled(*call_args))
    events = read_trace_events(d)
  out = kernel_profile(events, module, kernels, asynchronous)
  if not out.runs:
    raise HloAuditError(f"the profiler recorded no kernel of module {module!r}")
  return out

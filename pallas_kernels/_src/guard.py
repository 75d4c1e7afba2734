"""Guards: record why an op ran its XLA reference instead of its Pallas kernel.

Every op checks its arguments with an `unsupported_reason(...) -> str | None`
before launching. On a reason it runs the reference (so a user's program never
breaks) and calls `record_fallback`, which keeps the reason queryable through
`fallbacks()` and logs it once per (op, reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator

_log = logging.getLogger("pallas_kernels")


@dataclasses.dataclass(frozen=True, slots=True)
class Fallback:
  """One op call that ran the XLA reference instead of the kernel."""

  #: Public op name, e.g. "matmul".
  op: str
  #: Why the kernel could not run, e.g. "int4 weights need K divisible by group".
  reason: str
  #: Shapes and dtypes of the call, e.g. "x=bf16[7,64] w=int4[64,128]".
  signature: str


@dataclasses.dataclass(frozen=True, slots=True)
class KernelChoice:
  """Which kernel backend an op call was built with (`validate` and `bench`
  name it per row)."""

  #: Public op name, e.g. "matmul".
  op: str
  #: "mosaic_gpu" or "triton" (the Pallas backend the kernel lowers through).
  backend: str
  #: Why the preferred backend was not used ("" when it was).
  why: str
  #: Shapes and dtypes of the call.
  signature: str


class Records(list):
  """Fallbacks collected by `collect_fallbacks`; `.choices` the kernel
  choices made meanwhile."""

  def __init__(self):
    super().__init__()
    self.choices: list[KernelChoice] = []


_lock = threading.Lock()
_records: list[Fallback] = []
_choices: list[KernelChoice] = []
_logged: set[tuple[str, str]] = set()
# Per-thread sink of `collect_fallbacks` (None: record process-wide).
_sink = threading.local()


def record_fallback(op: str, reason: str, signature: str) -> Fallback:
  """Records (and logs once per op and reason) that `op` fell back to XLA."""
  record = Fallback(op=op, reason=reason, signature=signature)
  sink = getattr(_sink, "records", None)
  if sink is not None:
    sink.append(record)
    return record
  with _lock:
    _records.append(record)
    first = (op, reason) not in _logged
    _logged.add((op, reason))
  if first:
    _log.warning("pallas_kernels.%s falls back to XLA: %s (%s)", op, reason, signature)
  return record


def record_choice(op: str, backend: str, why: str, signature: str) -> KernelChoice:
  """Records which kernel backend built an op call (and why not the
  preferred one, if so)."""
  choice = KernelChoice(op=op, backend=backend, why=why, signature=signature)
  sink = getattr(_sink, "records", None)
  if sink is not None:
    sink.choices.append(choice)
    return choice
  with _lock:
    _choices.append(choice)
  return choice


def choices(op: str | None = None) -> tuple[KernelChoice, ...]:
  """Kernel backend choices recorded so far in this process."""
  with _lock:
    return tuple(c for c in _choices if op is None or c.op == op)


@contextlib.contextmanager
def collect_fallbacks() -> Iterator[Records]:
  """Within, fallbacks (and kernel choices, `.choices`) of this thread go to
  the yielded list only.

  For dry runs (e.g. `swap` asking an op's guard about a pattern under
  `jax.eval_shape`): nothing ran, so nothing is recorded or logged.
  """
  previous = getattr(_sink, "records", None)
  _sink.records = Records()
  try:
    yield _sink.records
  finally:
    _sink.records = previous


def fallbacks(op: str | None = None) -> tuple[Fallback, ...]:
  """Fallbacks recorded so far in this process, optionally for one op."""
  with _lock:
    return tuple(r for r in _records if op is None or r.op == op)


def clear_fallbacks() -> None:
  """Forgets recorded fallbacks and kernel choices (the once-only log state too)."""
  with _lock:
    _records.clear()
    _choices.clear()
    _logged.clear()


def signature(**arrays) -> str:
  """A compact "name=dtype[dims]" description of the arguments of a call."""
  parts = []
  for name, a in arrays.items():
    if a is None:
      continue
    shape = ",".join(str(d) for d in getattr(a, "shape", ()))
    parts.append(f"{name}={getattr(a, 'dtype', type(a).__name__)}[{shape}]")
  return " ".join(parts)


# Guards inside a jitted function (e.g. a backward that falls back) run when
# it is traced, so a cached trace records nothing on later calls. Ops register
# such jitted entry points here; `validate`/`bench` clear them per case so
# every case's fallbacks are seen, without clearing all of JAX's caches.
_traced_entry_points: list = []


def register_traced(fn):
  """Registers a jitted function (with `.clear_cache()`) whose trace runs guards.

  Usable as a decorator; returns `fn`.
  """
  with _lock:
    _traced_entry_points.append(fn)
  return fn


def retrace_guards() -> None:
  """Drops the trace caches of registered entry points (guards run again)."""
  with _lock:
    entry_points = list(_traced_entry_points)
  for fn in entry_points:
    fn.clear_cache()

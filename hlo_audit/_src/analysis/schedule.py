"""The flattened schedule: every executed instruction at a logical time.

Mirrors XLA's `HloLiveRange::FlattenSchedule` (module-scoped): computations
run in their text order (the schedule, for `is_scheduled` modules); a call,
conditional or async-start runs its called computations first, a while runs
its condition then its body, each once, then the instruction itself. Times are
positions in this sequence, the same positions XLA's live-range report uses.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from hlo_audit._src.hlo.ir import Computation, HloModule

#: Opcodes whose called computations are part of the flattened schedule.
_FLATTEN_CALLEES = frozenset({"call", "conditional", "async-start"})


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
  """Instruction order of one module, flattened through control flow."""

  #: (computation name, instruction name) in execution order.
  sequence: tuple[tuple[str, str], ...]
  #: instruction name -> its time (index in `sequence`).
  time: Mapping[str, int]
  #: computation name -> [start, end) span of its instructions' times.
  span: Mapping[str, tuple[int, int]]
  #: Whether the module said it is scheduled (else text order is assumed).
  is_scheduled: bool

  @property
  def end(self) -> int:
    """One past the last time."""
    return len(self.sequence)

  def computations(self) -> tuple[str, ...]:
    """Computations in the schedule, in the order they were entered."""
    return tuple(self.span)


def flatten_schedule(module: HloModule) -> Schedule:
  """Flattens `module`'s schedule from its entry computation."""
  sequence: list[tuple[str, str]] = []
  time: dict[str, int] = {}
  span: dict[str, tuple[int, int]] = {}
  entered = {module.entry_name}
  # Frames of (computation, next instruction index, start time); a loop, not
  # recursion, so deep control flow cannot exhaust Python's stack.
  stack: list[tuple[Computation, int, int]] = [(module.entry, 0, 0)]
  while stack:
    comp, i, start = stack[-1]
    insts = comp.instructions
    if i == len(insts):
      stack.pop()
      span[comp.name] = (start, len(sequence))
      continue
    inst = insts[i]
    if inst.opcode in _FLATTEN_CALLEES or inst.opcode == "while":
      called = inst.called_computations
      if inst.opcode == "while":
        callees = called.get("condition", ()) + called.get("body", ())
      else:
        callees = inst.called_computation_names()
      pending = [n for n in callees if n in module and n not in entered]
      if pending:
        # Run the first unvisited callee; come back to `inst` afterwards.
        entered.add(pending[0])
        stack.append((module.computation(pending[0]), 0, len(sequence)))
        continue
    time[inst.name] = len(sequence)
    sequence.append((comp.name, inst.name))
    stack[-1] = (comp, i + 1, start)
  return Schedule(tuple(sequence), types.MappingProxyType(time),
                  types.MappingProxyType(span), module.is_scheduled)

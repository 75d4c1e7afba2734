"""The audited program: the one context every finder and what-if replay reads.

`Program` holds what the analyses found (schedule, dataflow, liveness,
kernels, buffers) and what the audit was asked (options, kernel libraries);
the detectors, the memory and collective findings and the replays take it
whole. It also names things as the user does: arguments by their pytree
paths, buffers as the report's rows spell them.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence

from hlo_audit._src.analysis.buffer_sharing import HeapModel, heap_model
from hlo_audit._src.analysis.buffers import Buffer
from hlo_audit._src.analysis.dataflow import Dataflow, ValueId
from hlo_audit._src.analysis.kernel_library import Libraries
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.liveness import Liveness
from hlo_audit._src.analysis.options import AuditOptions
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction
from hlo_audit._src.target.devices import DeviceFacts


class WhatIfError(HloAuditError, ValueError):
  """A what-if naming a buffer, argument or finding the program lacks."""


@dataclasses.dataclass(frozen=True, slots=True)
class Argument:
  """One array leaf of a jitted function's arguments, as JAX passes it."""

  #: Entry parameter number in the HLO.
  parameter: int
  #: Pytree path, e.g. "params['dense']['kernel']".
  path: str
  #: Positional argument it belongs to (None: keyword-only or unknown).
  argnum: int | None = None
  #: Name of that argument in the function's signature, when known.
  argname: str | None = None


@dataclasses.dataclass(slots=True)
class Tables:
  """What the finders ask many times of the same kernels, filled on first
  use (an epilogue's dependency walk, a reduction's neighbours)."""

  #: kernel name -> the JAX primitives (or opcodes) it runs.
  primitives: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
  #: computation -> instruction name -> its users, in text order.
  users: dict[str, dict[str, list[Instruction]]] = dataclasses.field(default_factory=dict)
  #: kernel name -> the computation it runs, None for no fusion
  #: (`detectors.common.fused_computation`).
  fused: dict[str, Computation | None] = dataclasses.field(default_factory=dict)
  #: kernel name -> "dot", "convolution" or None (`detectors.common.anchor_of`).
  anchors: dict[str, str | None] = dataclasses.field(default_factory=dict)
  #: kernel name -> for each operand, the kernels whose outputs it holds.
  inputs: dict[str, tuple[tuple[str, ...], ...]] = dataclasses.field(default_factory=dict)
  #: kernel name -> the reduce summing a gemm's split-K partial sums in it
  #: (`detectors.common.split_k_site`).
  split_k: dict[str, Instruction | None] = dataclasses.field(default_factory=dict)
  #: kernel name -> whether it does same-index work only.
  same_index: dict[str, bool] = dataclasses.field(default_factory=dict)
  #: (fused computation, past reduces) -> instruction name -> the parameter
  #: numbers it is computed from, as a bit mask (`detectors.reductions`).
  reached: dict[tuple[str, bool], dict[str, int]] = dataclasses.field(
      default_factory=dict)
  #: fused computation -> its reduce and reduce-window instructions that are
  #: no split-K sum (`detectors.reductions`).
  reduces: dict[str, tuple[Instruction, ...]] = dataclasses.field(default_factory=dict)
  #: result dims -> kernel name -> (broadcast, parameter) of its fusion's
  #: broadcasts of a parameter (`detectors.reductions`; None until asked).
  broadcasts: dict[tuple[int, ...], dict[str, list[tuple[Instruction, Instruction]]]] | None = None
  #: The program's collectives (`collectives.find_collectives`; None until asked).
  collectives: tuple | None = None

  def clear(self) -> None:
    """Drops every table (a report keeps its program, not these)."""
    self.primitives, self.users, self.anchors, self.fused, self.split_k = {}, {}, {}, {}, {}
    self.inputs, self.same_index, self.reached, self.reduces = {}, {}, {}, {}
    self.broadcasts = self.collectives = None


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
  """The audited program and the audit's settings, as every finder and
  replay reads them. The fields are fixed, and the tables derived from them
  (`comps`, `writes`, `loop_of`, `has_backward`) made once; `tables` and
  `cache` fill as the finders and replays ask."""

  module: HloModule
  schedule: Schedule
  dataflow: Dataflow
  liveness: Liveness
  #: Kernels by name, in schedule order.
  kernels: Mapping[str, Kernel] = dataclasses.field(default_factory=dict)
  #: Buffers by name, largest first.
  buffers: Mapping[str, Buffer] = dataclasses.field(default_factory=dict)
  arguments: tuple[Argument, ...] = ()
  #: The backend that compiled it ("gpu", "cpu", ""): whose buffer-sharing
  #: rules replays follow.
  platform: str = ""
  options: AuditOptions = AuditOptions()
  libraries: Libraries = Libraries()
  #: The device the program is priced for (`DeviceFacts`; None: unknown):
  #: kernel libraries read which of their calls it runs.
  device: DeviceFacts | None = None
  #: The version of the libtpu that compiled it ("": unknown, or not XLA:TPU).
  libtpu_version: str = ""
  #: Gives the module's text before XLA optimized it, where captured (it
  #: keeps the parameters' shardings newer XLA drops); called only when a
  #: partitioned module needs it (converting a large module costs ~1 s).
  pre_optimization: Callable[[], str | None] | None = dataclasses.field(
      default=None, compare=False, repr=False)
  #: Tables replays share (filled on first use; the baseline liveness run
  #: fills its own).
  cache: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
  #: Tables the finders share (filled on first use).
  tables: Tables = dataclasses.field(default_factory=Tables, compare=False, repr=False)
  #: Scheduled computations by name.
  comps: Mapping[str, Computation] = dataclasses.field(init=False, compare=False,
                                                       repr=False)
  #: Kernel name -> the buffers it writes.
  writes: Mapping[str, tuple[Buffer, ...]] = dataclasses.field(init=False, compare=False,
                                                               repr=False)
  #: While body computation -> name of the while instruction running it.
  loop_of: Mapping[str, str] = dataclasses.field(init=False, compare=False, repr=False)
  #: Whether the program holds a backward pass (a kernel of a VJP).
  has_backward: bool = dataclasses.field(init=False, compare=False, repr=False)

  @property
  def heap(self) -> HeapModel:
    """How the backend that compiled it shares buffers and sizes its heap
    (XLA:TPU's by the generation the program is priced for)."""
    return heap_model(self.platform, self.device.name if self.device is not None else "",
                      self.libtpu_version)

  @property
  def pre_optimization_text(self) -> str:
    """The module's text before XLA optimized it ("" where not captured)."""
    if "pre_optimization_text" not in self.cache:
      self.cache["pre_optimization_text"] = (
          (self.pre_optimization() if self.pre_optimization else None) or "")
    return self.cache["pre_optimization_text"]

  def __post_init__(self) -> None:
    """Derives the tables every finder reads."""
    module, set_ = self.module, object.__setattr__
    by_kernel: dict[str, list[Buffer]] = {}
    for b in self.buffers.values():
      if b.producer:
        by_kernel.setdefault(b.producer, []).append(b)
    set_(self, "comps", {n: module.computation(n) for n in self.schedule.span})
    set_(self, "writes", {k: tuple(v) for k, v in by_kernel.items()})
    set_(self, "loop_of", {body: i.name for comp in module.computations
                           for i in comp.instructions if i.opcode == "while"
                           for body in i.called_computations.get("body", ())})
    set_(self, "has_backward", any("transpose(" in k.op_name for k in self.kernels.values()))

  def inst(self, kernel: Kernel) -> Instruction:
    """The instruction that launches `kernel`."""
    return self.comps[kernel.computation].instruction(kernel.name)

  def users(self, comp: Computation, name: str) -> list[Instruction]:
    """Instructions of `comp` that read `name`, in text order."""
    table = self.tables.users.get(comp.name)
    if table is None:
      table = self.tables.users[comp.name] = {}
      for i in comp.instructions:
        for o in dict.fromkeys(i.operands):
          table.setdefault(o, []).append(i)
    return table.get(name, [])

  def find_instruction(self, name: str) -> Instruction | None:
    """The instruction `name` of a scheduled computation, or None."""
    for comp_name in self.schedule.span:
      comp = self.module.computation(comp_name)
      if name in comp:
        return comp.instruction(name)
    return None


# ---------------------------------------------------------------- naming ----


def arguments_of(module: HloModule, argument_names: Sequence[str]) -> tuple[Argument, ...]:
  """The entry parameters as the user's arguments: the pytree path JAX writes
  in each parameter's `op_name`, and the argument number its leading name has
  in the function's signature (`argument_names`, "*args" for var-positional)."""
  out = []
  star = next((i for i, n in enumerate(argument_names) if n.startswith("*")), None)
  for p in module.entry.parameters:
    path = p.op_name or p.name
    head = re.match(r"[A-Za-z_][A-Za-z_0-9]*", path)
    name = head.group(0) if head else None
    argnum = None
    if name is not None and name in argument_names:
      argnum = argument_names.index(name)
    elif star is not None and name == argument_names[star][1:]:
      index = re.match(r"\[(\d+)\]", path[len(name):])
      if index:
        argnum, name = star + int(index.group(1)), None
    out.append(Argument(parameter=p.parameter_number, path=path, argnum=argnum,
                        argname=name if argnum is not None else None))
  return tuple(out)


def buffer_name(vid: ValueId) -> str:
  """A buffer's display name, as the report's Buffer rows spell it."""
  return vid[0] + ("{" + ",".join(map(str, vid[1])) + "}" if vid[1] else "")


def _parse_buffer_name(name: str) -> ValueId:
  if name.endswith("}") and "{" in name:
    inst, _, idx = name[:-1].partition("{")
    try:
      return inst, tuple(int(i) for i in idx.split(",") if i.strip())
    except ValueError:
      raise WhatIfError(f"bad buffer name {name!r}: expected NAME or NAME{{i,j}}") from None
  return name, ()


def find_buffer(dataflow: Dataflow, name: str) -> ValueId | None:
  """The buffer holding the value `name` ("fusion.3" or "fusion.3{1}"), or
  None (a tuple-shaped instruction named without its index: its only leaf)."""
  try:
    vid = _parse_buffer_name(name)
  except WhatIfError:
    return None
  if vid not in dataflow.values:
    if vid[1]:
      return None
    leaves = [i for i, _ in dataflow.holds.get(vid[0], ()) if i != ()]
    if len(leaves) != 1 or (vid[0], leaves[0]) not in dataflow.values:
      return None
    vid = (vid[0], leaves[0])
  return dataflow.buffer_of[vid]


def resolve_buffer(dataflow: Dataflow, name: str) -> ValueId:
  """`find_buffer`, or an error naming the closest buffers.

  Raises:
    WhatIfError: when the program has no such value.
  """
  _parse_buffer_name(name)  # a malformed name says so
  found = find_buffer(dataflow, name)
  if found is None:
    names = [buffer_name(b) for b in dataflow.buffers]
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise WhatIfError(f"no buffer {name!r} in the program{hint}")
  return found


def parameter_paths(module: HloModule) -> Mapping[int, str]:
  """Entry parameter number -> the argument path JAX wrote in its metadata
  (`op_name`), or the parameter's name when there is none."""
  return module._cached("parameter_paths", lambda: types.MappingProxyType({
      p.parameter_number: (p.op_name or p.name)
      for p in module.entry.parameters}))


def _under_path(module: HloModule, spec: str) -> list[int]:
  """Parameters whose path is `spec` or lies under it (`spec[...]`,
  `spec.x`), in path order: a bisection of the sorted paths, since a
  donation replay resolves every leaf's path by itself."""
  ordered = module._cached("sorted_parameter_paths", lambda: sorted(
      (path, n) for n, path in parameter_paths(module).items()))
  found = []
  for prefix, whole in ((spec, True), (spec + "[", False), (spec + ".", False)):
    i = bisect.bisect_left(ordered, (prefix,))
    while i < len(ordered) and (ordered[i][0] == prefix if whole
                                else ordered[i][0].startswith(prefix)):
      found.append(ordered[i][1])
      i += 1
  return found


def _by_argname(program: Program) -> Mapping[str, tuple[int, ...]]:
  """Argument name -> its parameters, in argument order (a donation replay
  resolves each leaf by itself: no scan of every argument per leaf)."""
  found = program.cache.get("parameters_by_argname")
  if found is None:
    table: dict[str, list[int]] = {}
    for a in program.arguments:
      if a.argname is not None:
        table.setdefault(a.argname, []).append(a.parameter)
    found = program.cache["parameters_by_argname"] = {
        k: tuple(v) for k, v in table.items()}
  return found


def resolve_arguments(program: Program, specs: Iterable[int | str]) -> list[int]:
  """Entry parameter numbers named by `specs`: argument numbers (when the
  capture knows them), argument names or pytree paths (a prefix path names
  every leaf under it, e.g. "params" or "params['dense']"), or HLO parameter
  names.

  Raises:
    WhatIfError: for a spec naming no parameter.
  """
  paths = parameter_paths(program.module)
  names = program.module._cached("parameter_numbers", lambda: {
      p.name: p.parameter_number for p in program.module.entry.parameters})
  out: list[int] = []
  for spec in specs:
    found: list[int] = []
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
      n = int(spec)
      if not program.arguments:
        raise WhatIfError(
            f"donate={n}: argument numbers need the jitted function's arguments "
            "(audit(fn, *args)); name the argument or its path instead, e.g. "
            + ", ".join(repr(p) for p in list(paths.values())[:3]))
      found = [a.parameter for a in program.arguments if a.argnum == n]
    else:
      spec = spec.strip()
      if spec in names:
        found = [names[spec]]
      else:
        found = _under_path(program.module, spec)
        found += [n for n in _by_argname(program).get(spec, ()) if n not in found]
    if not found:
      heads = {re.split(r"[\[.]", p, maxsplit=1)[0] for p in paths.values()}
      close = difflib.get_close_matches(str(spec), sorted(heads) + list(paths.values()), n=3)
      hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
      raise WhatIfError(f"donate: no argument {spec!r} in the program{hint}")
    out.extend(n for n in sorted(found) if n not in out)
  return out

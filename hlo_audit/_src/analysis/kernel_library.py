"""The seam to kernel libraries: what a library that closes gaps implements.

hlo-audit names the work a fused kernel would have to do to close a finding
(`KernelNeed`: the anchor, the fused ops, the shape); a kernel library, found
through the `hlo_audit.kernel_libraries` entry-point group, says which of its
ops does that work (`kernel_for`), writes a ready-to-paste call with the
finding's shapes (`suggest`), offers its ops to sweeps (`sweep_targets`), and
swaps its kernels into a function (`swap`, `verify`). hlo-audit never imports
a library by name: the library plugs in, so imports run one way.

Plain data and pure functions, no JAX: the audit runs where only HLO text is
at hand, and without any library it still names the kernel each gap needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord, KernelNeed,
                                             with_changes)
from hlo_audit._src.hlo.ir import HloModule

#: The entry-point group kernel libraries advertise themselves under.
ENTRY_POINT_GROUP = "hlo_audit.kernel_libraries"


@dataclasses.dataclass(frozen=True, slots=True)
class KernelChoice:
  """A library's answer to a `KernelNeed`."""

  #: The public op that closes the gap, e.g. "pallas_kernels.matmul"; None
  #: when the library has none.
  op: str | None
  #: Why not, when `op` is None and an op came close (e.g.
  #: "pallas_kernels.matmul writes one output"); "" when nothing does.
  why_not: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Suggestion:
  """A ready-to-paste call of a library op, and its guard's verdict."""

  #: e.g. "pallas_kernels.matmul(x, w, bias=bias)  # x: f32[8,16], ... -> f32[8,32]".
  call: str
  #: Whether the kernel would run for these shapes, or why it falls back.
  guard_verdict: str


@runtime_checkable
class KernelSweep(Protocol):
  """One op a library offers to `hlo-audit sweep` (a kernel target)."""

  #: The parameters a grid may set (`hlo_audit.plugins.SweepParam`).
  params: tuple[Any, ...]

  def run(self, params: Mapping[str, Any], measure: Any,
          audit: Callable[[Callable[..., Any], Sequence[Any]], dict[str, Any]]
          ) -> dict[str, Any]:
    """Audits the op's XLA implementation at one point through `audit(fn,
    abstract_args)` (which compiles and returns the audit's record), and adds
    the op's cost model and, as `measure` asks, validation and timing."""


@runtime_checkable
class KernelLibrary(Protocol):
  """A kernel library that closes the gaps the audit finds."""

  #: Its name, e.g. "pallas_kernels".
  name: str
  #: The named scope its ops put around each kernel launch (found in
  #: `op_name` metadata), e.g. "pallas_kernels.".
  scope_prefix: str
  # Optional: `swapped_by`, the name of the library whose `swap` and
  # `verify` put this one's calls in (e.g. JAX's own fused calls, which
  # pallas_kernels offers and swaps); absent or "": its own.

  def kernel_for(self, finding: FusionDecisionRecord) -> KernelChoice:
    """The op that closes `finding` (its `need` says what it must compute)."""

  def suggest(self, finding: FusionDecisionRecord, module: HloModule, *,
              device: Any = None) -> Suggestion | None:
    """A call of the op `kernel_for` chose, with the finding's shapes;
    `device` is the audited device's `DeviceFacts` (None: unknown), whose
    `platform` and `compute_capability` say which implementation runs there.
    (A library whose `suggest` takes no `device` is called without it.)"""

  def sweep_targets(self) -> Mapping[str, KernelSweep]:
    """The ops sweeps can target, by name."""

  def swap(self, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """`fn` with the library's kernels swapped in (`report(*args)` on the
    result describes what was replaced)."""

  def verify(self, baseline: Callable[..., Any], candidate: Callable[..., Any],
             *args: Any, **options: Any) -> Any:
    """The acceptance gate of replacing `baseline` by `candidate`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Libraries:
  """The kernel libraries an audit consults, and what their loading said."""

  libraries: tuple[KernelLibrary, ...] = ()
  #: Notes for the report: a library that failed to load, or none installed.
  notes: tuple[str, ...] = ()

  @property
  def swapping(self) -> tuple[KernelLibrary, ...]:
    """The libraries that swap their own fixes in (`swapped_by` unset)."""
    return tuple(lib for lib in self.libraries if not getattr(lib, "swapped_by", ""))

  @property
  def scopes(self) -> tuple[str, ...]:
    return tuple(lib.scope_prefix for lib in self.libraries if lib.scope_prefix)

  def owner(self, op: str) -> KernelLibrary | None:
    """The library whose op `op` ("pallas_kernels.matmul") is."""
    for lib in self.libraries:
      if op.startswith(lib.name + "."):
        return lib
    return None

  def choose(self, finding: FusionDecisionRecord) -> KernelChoice:
    """The first library's op that closes `finding`; else the first reason
    one gave."""
    why = ""
    for lib in self.libraries:
      choice = lib.kernel_for(finding)
      if choice.op:
        return choice
      why = why or choice.why_not
    return KernelChoice(None, why)


#: What findings say when no kernel library is installed.
NO_LIBRARY = "no kernel library is installed"


def with_kernels(findings: Sequence[FusionDecisionRecord],
                 libraries: Libraries) -> list[FusionDecisionRecord]:
  """`findings` with `kernel` and `guard` filled from the libraries' answers
  to each finding's `need` (findings without one pass unchanged)."""
  out = []
  for f in findings:
    need = f.need
    if need is None:
      out.append(f)
      continue
    installed = bool(libraries.libraries)
    choice = libraries.choose(f) if installed else KernelChoice(None)
    out.append(with_changes(
        f, kernel=choice.op, guard=_guard(f, need, choice, installed),
        evidence=f.evidence + _evidence_suffix(f, choice, installed)))
  return out


def _guard(f: FusionDecisionRecord, need: KernelNeed, choice: KernelChoice,
           installed: bool) -> str:
  op = choice.op
  if op is not None:
    if need.kind is FindingKind.LAYOUT_CONFLICT:
      return f"{op} falls back to XLA's dot outside its guard"
    if need.kind is FindingKind.SEPARATE_REDUCTION:
      return f"{op} runs XLA's reference outside its guard"
    return f"{op} runs XLA's reference outside its shape/dtype rules"
  if need.kind is FindingKind.SEPARATE_REDUCTION:
    # The reduction stays XLA's; why no kernel is part of the evidence.
    return f.guard
  if not installed:
    return f"{need.describe()} would close it; {NO_LIBRARY}"
  if choice.why_not:
    return f"no kernel yet: {choice.why_not}"
  return f.guard


def _evidence_suffix(f: FusionDecisionRecord, choice: KernelChoice,
                     installed: bool) -> str:
  if f.kind is not FindingKind.SEPARATE_REDUCTION or choice.op is not None:
    return ""
  if not installed:
    return f"; {f.need.describe()} would close it; {NO_LIBRARY}"
  return "; no kernel yet" + (f": {choice.why_not}" if choice.why_not else "")


# ------------------------------------------------------------ discovery ----

_installed: Libraries | None = None


def installed_libraries(names: Sequence[str] | None = None, *,
                        refresh: bool = False) -> Libraries:
  """The kernel libraries installed under the `hlo_audit.kernel_libraries`
  entry-point group (the way JAX finds its PJRT plugins), loaded once per
  process; a library that fails to load is a note, never an error.

  Args:
    names: keep only the libraries of these names, in this order (None: all,
      by name; (): none, as if none were installed).
    refresh: look again (after installing one).
  """
  global _installed
  if _installed is None or refresh:
    _installed = _discover()
  found = _installed
  if names is None:
    libs = found.libraries
  else:
    by_name = {lib.name: lib for lib in found.libraries}
    libs = tuple(by_name[n] for n in names if n in by_name)
    missing = [n for n in names if n not in by_name]
    if missing:
      return Libraries(libs, found.notes + (
          f"kernel libraries not installed: {', '.join(missing)}",))
  notes = found.notes
  if not libs:
    notes += (f"{NO_LIBRARY}: findings name the kernel each gap needs, without a "
              f"call to paste (libraries register under the {ENTRY_POINT_GROUP!r} "
              "entry-point group)",)
  return Libraries(libs, notes)


def _discover() -> Libraries:
  import importlib.metadata

  libs: dict[str, KernelLibrary] = {}
  notes = []
  seen = set()
  for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                   key=lambda e: (e.name, e.value)):
    if (ep.name, ep.value) in seen:  # one distribution seen twice on the path
      continue
    seen.add((ep.name, ep.value))
    try:
      obj = ep.load()
      if not isinstance(obj, KernelLibrary) and callable(obj):
        obj = obj()
    except Exception as e:  # noqa: BLE001 - a broken plug-in is a note.
      notes.append(f"kernel library {ep.name!r} failed to load ({ep.value}): "
                   f"{type(e).__name__}: {e}")
      continue
    if not isinstance(obj, KernelLibrary):
      notes.append(f"kernel library {ep.name!r} ({ep.value}) does not implement "
                   "hlo_audit.plugins.KernelLibrary: ignored")
      continue
    libs.setdefault(obj.name, obj)
  return Libraries(tuple(libs.values()), tuple(notes))

"""Read XLA dump folders (`XLA_FLAGS=--xla_dump_to=DIR`) from any backend.

A dump folder holds, per compiled module, files named like
`[<timestamp>.]module_<id>.<name>.<stage>.txt` where the stage of the
optimized module ends in `after_optimizations` (`cpu_after_optimizations`,
`sm_9.0_gpu_after_optimizations`, TPU and ROCm names alike), and XLA's reports
sit beside it with suffixes `-buffer-assignment.txt`, `-live-range.txt` and
`-memory-usage-report.txt`. Modules are listed cheaply and parsed on demand:
a real dump can hold hundreds of small modules.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Sequence

from hlo_audit._src.capture.result import Capture
from hlo_audit._src.errors import DumpError
from hlo_audit._src.hlo.xla_reports import (BufferAssignment, LiveRange,
                                            parse_buffer_assignment,
                                            parse_live_range)

_AFTER = "after_optimizations"
_REPORTS = ("-buffer-assignment.txt", "-live-range.txt",
            "-memory-usage-report.txt")
_NAME = re.compile(r"^(?:(?P<ts>\d+)\.)?module_(?P<id>\d+)\.(?P<rest>.+)$")
_MODULE_FILE = re.compile(r"\.(?:before_optimizations|[\w.\-]*after_optimizations)\.txt$")


@dataclasses.dataclass(frozen=True, slots=True)
class DumpedModule:
  """One module of a dump folder: its files, not yet read."""

  #: Module id XLA gave it (the NNNN in module_NNNN).
  id: int
  #: Module name, e.g. "jit_train_step".
  name: str
  #: The stage of `text_path`, e.g. "sm_9.0_gpu_after_optimizations".
  stage: str
  text_path: str
  buffer_assignment_path: str | None = None
  live_range_path: str | None = None
  memory_usage_report_path: str | None = None
  before_optimizations_path: str | None = None
  #: Timestamp prefix, when XLA was asked to add one.
  timestamp: int | None = None

  @property
  def after_optimizations(self) -> bool:
    return self.stage.endswith(_AFTER)

  @property
  def platform(self) -> str:
    """"cpu", "gpu", "tpu" or "" from the stage's name."""
    s = self.stage.lower()
    for key, platform in (("gpu", "gpu"), ("sm_", "gpu"), ("gfx", "gpu"),
                          ("tpu", "tpu"), ("cpu", "cpu")):
      if key in s:
        return platform
    return ""

  @property
  def size(self) -> int:
    """Bytes of the HLO text file."""
    try:
      return os.path.getsize(self.text_path)
    except OSError:
      return 0

  def read_text(self) -> str:
    return _read(self.text_path)

  def read_buffer_assignment(self) -> BufferAssignment | None:
    if self.buffer_assignment_path is None:
      return None
    return parse_buffer_assignment(_read(self.buffer_assignment_path),
                                   self.buffer_assignment_path)

  def read_live_range(self) -> LiveRange | None:
    if self.live_range_path is None:
      return None
    return parse_live_range(_read(self.live_range_path), self.live_range_path)

  def read_memory_usage_report(self) -> str | None:
    return _read(self.memory_usage_report_path) if self.memory_usage_report_path else None

  def read_before_optimizations(self) -> str | None:
    return _read(self.before_optimizations_path) if self.before_optimizations_path else None

  def capture(self):
    """Parses the module and its reports into a `Capture`."""
    from hlo_audit._src.hlo.parser import parse_hlo

    text = self.read_text()
    notes = []
    if self.buffer_assignment_path is None:
      notes.append("the dump has no buffer-assignment report for this module")
    if self.live_range_path is None:
      notes.append("the dump has no live-range report for this module")
    buffer_assignment = self.read_buffer_assignment()
    return Capture(
        module=parse_hlo(text, source=self.text_path), hlo_text=text,
        pre_optimization=self.read_before_optimizations(),
        platform=self.platform, xla_buffer_assignment=buffer_assignment,
        xla_memory_source="dump reports" if buffer_assignment is not None else "",
        live_range=self.read_live_range(),
        memory_usage_report=self.read_memory_usage_report(), origin="dump",
        path=self.text_path, notes=tuple(notes))


def _read(path: str) -> str:
  with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
    return f.read()


def read_dump_dir(path: str) -> list[DumpedModule]:
  """Every module text in the folder `path` (after and before optimizations),
  with its reports attached; sorted by timestamp, id and stage."""
  try:
    names = os.listdir(path)
  except OSError as e:
    raise DumpError(f"cannot read dump folder {path!r}: {e.strerror}") from e
  present = set(names)
  out = []
  for fname in names:
    if not fname.endswith(".txt") or any(fname.endswith(r) for r in _REPORTS):
      continue
    if "-buffer-assignment" in fname or not _MODULE_FILE.search(fname):
      continue
    m = _NAME.match(fname)
    if m is None:
      continue
    rest = m.group("rest")[: -len(".txt")]
    # rest = "<module name>.<stage>": the stage is the last dotted part that
    # names an optimization stage; module names may hold dots themselves.
    stage_at = _stage_start(rest)
    if stage_at < 0:
      continue
    name, stage = rest[:stage_at - 1], rest[stage_at:]
    prefix = fname[: -len(".txt")]

    def sibling(suffix: str) -> str | None:
      f = prefix + suffix
      return os.path.join(path, f) if f in present else None

    before = None
    if stage.endswith(_AFTER):
      head = fname[: fname.index(m.group("rest"))]
      b = f"{head}{name}.before_optimizations.txt"
      before = os.path.join(path, b) if b in present else None
    out.append(DumpedModule(
        id=int(m.group("id")), name=name, stage=stage,
        text_path=os.path.join(path, fname),
        buffer_assignment_path=sibling("-buffer-assignment.txt"),
        live_range_path=sibling("-live-range.txt"),
        memory_usage_report_path=sibling("-memory-usage-report.txt"),
        before_optimizations_path=before,
        timestamp=int(m.group("ts")) if m.group("ts") else None))
  out.sort(key=lambda d: (d.timestamp or 0, d.id, d.stage))
  return out


def _stage_start(rest: str) -> int:
  if rest.endswith("before_optimizations"):
    i = rest.rfind(".before_optimizations")
    return i + 1 if i >= 0 else -1
  if rest.endswith(_AFTER):
    # The stage starts after the last dot that precedes a tag such as
    # "cpu_", "sm_9.0_gpu_" (which holds a dot itself) or nothing.
    m = re.search(r"\.((?:sm_\d+\.\d+[a-z]?_)?[\w\-]*" + _AFTER + r")$", rest)
    return m.start(1) if m else -1
  return -1


@dataclasses.dataclass(frozen=True, slots=True)
class Dump:
  """An XLA dump folder (or one HLO text file) and its modules."""

  path: str
  #: Optimized modules, in dump order.
  modules: tuple[DumpedModule, ...]

  def __iter__(self) -> Iterator[DumpedModule]:
    return iter(self.modules)

  def __len__(self) -> int:
    return len(self.modules)

  def names(self) -> tuple[str, ...]:
    return tuple(m.name for m in self.modules)

  def select(self, module: str | None = None) -> DumpedModule:
    """The module `module` picks (`matching`: an id, or a regex searched in
    the names), or the largest module when `module` is None.

    Raises:
      DumpError: naming the candidates, if none or several match (modules
        that share a name are told apart by id).
    """
    if not self.modules:
      raise DumpError(f"{self.path!r} holds no optimized HLO module")
    if module is None:
      return max(self.modules, key=lambda m: m.size)
    found = matching(self.modules, module, self.path)
    if len(found) > 1:
      names = {m.name for m in found}
      if len(names) > 1:
        raise DumpError(f"{module!r} matches several modules in {self.path!r}: "
                        + ", ".join(sorted(names)))
      raise DumpError(f"{module!r} matches {len(found)} modules named {found[0].name!r} in "
                      f"{self.path!r} (ids " + ", ".join(str(m.id) for m in found)
                      + "): pick one by its id, e.g. --module " + str(found[-1].id))
    return found[0]

  def capture(self, module: str | None = None):
    """Parses `select(module)` into a `Capture`."""
    return self.select(module).capture()


def load_dump(path: str | os.PathLike, module: str | None = None) -> Dump:
  """Reads an XLA dump folder, or a single HLO text file, from any backend.

  Args:
    path: a folder written by `XLA_FLAGS=--xla_dump_to=DIR` (or per-compile
      `xla_dump_to`), or one HLO text file.
    module: keep only modules whose name matches this regex.

  Returns:
    The dump: its optimized modules, listed without being parsed; call
    `dump.capture(name)` or `module.capture()` to parse one.

  Raises:
    DumpError: for a missing path, an empty folder, or a folder with no
      optimized HLO module (the message lists what it saw).
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DumpError(f"no such file or folder: {path!r}")
  if os.path.isfile(path):
    name = os.path.basename(path)
    stem = name[:-4] if name.endswith(".txt") else os.path.splitext(name)[0]
    prefix = path[:-4] if path.endswith(".txt") else None

    def sibling(suffix: str) -> str | None:
      if prefix is None:
        return None
      p = prefix + suffix
      return p if os.path.exists(p) else None

    mod = DumpedModule(id=0, name=stem, stage="text", text_path=path,
                       buffer_assignment_path=sibling("-buffer-assignment.txt"),
                       live_range_path=sibling("-live-range.txt"),
                       memory_usage_report_path=sibling("-memory-usage-report.txt"))
    return Dump(path, (mod,))
  found = read_dump_dir(path)
  optimized = [m for m in found if m.after_optimizations]
  if not optimized:
    entries = sorted(os.listdir(path))
    if not entries:
      raise DumpError(f"dump folder {path!r} is empty")
    seen = ", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "")
    raise DumpError(
        f"{path!r} holds no '*after_optimizations.txt' module: is it an XLA dump "
        f"folder (XLA_FLAGS=--xla_dump_to=DIR)? It holds: {seen}")
  if module is not None:
    optimized = matching(optimized, module, path)
  return Dump(path, tuple(optimized))


def matching(modules: Sequence[DumpedModule], module: str, path: str) -> list[DumpedModule]:
  """The modules `module` names: the one with that id when it is a number
  some module has as its id (`--list` shows ids; modules of one name differ
  only there), else those whose name the regex `module` matches.

  Raises:
    DumpError: for an invalid regex, or when nothing matches (the message
      lists the modules).
  """
  if module.strip().isdigit():
    by_id = [m for m in modules if m.id == int(module)]
    if by_id:
      return by_id
  try:
    pattern = re.compile(module)
  except re.error as e:
    raise DumpError(f"--module {module!r} is not a valid regular expression: {e}") from e
  found = [m for m in modules if pattern.search(m.name)]
  if not found:
    raise DumpError(f"no module matching {module!r} in {path!r}; modules: "
                    + ", ".join(sorted({m.name for m in modules})))
  return found

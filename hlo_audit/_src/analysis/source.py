"""Source attribution: which frame of an instruction's stack is the user's.

XLA keeps each instruction's Python stack (the StackFrames table, or only
`source_file`/`source_line` in older metadata). Its innermost frame is often
inside a library (`flax/nnx/nn/linear.py`, optax, jax itself), where a user
can change nothing. A finding's `source` is the innermost frame in the user's
code; the library frame stays available as context ("in flax Linear.__call__,
called from model.py:27"). Pure functions; the path patterns are
`AuditOptions.library_paths` / `user_paths`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from hlo_audit._src.hlo.ir import (Computation, HloModule, Instruction, Metadata,
                                   SourceLocation)

#: Regexes (searched in the '/'-separated path) of files that are not the
#: user's: installed packages, the standard library, jax and jaxlib from a
#: source checkout, this project's own internals, and Python's frozen modules
#: (the audit adds each kernel library's internals: `library_source_path`).
DEFAULT_LIBRARY_PATHS: tuple[str, ...] = (
    r"/(site|dist)-packages/",
    r"/lib/python\d+(\.\d+)?t?/(?!(site|dist)-packages/)",
    r"(^|/)jax/_src/",
    r"(^|/)jaxlib/",
    r"(^|/)hlo_audit/_src/",
    r"^<frozen ",
)


def library_source_path(package: str) -> str:
  """The path regex of a kernel library's internals (its `_src` folder,
  where its kernels' frames are, even from a source checkout)."""
  return rf"(^|/){re.escape(package)}/_src/"

#: Regexes of files that are the user's wherever they are installed: the
#: built-in examples stand for user code.
DEFAULT_USER_PATHS: tuple[str, ...] = (r"(^|/)hlo_audit/_src/examples/",)

_INSTALLED = re.compile(r"/(?:site|dist)-packages/([^/]+)/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")
_SRC_PACKAGE = re.compile(r"(?:^|/)([A-Za-z_][A-Za-z0-9_]*)/_src/")


@functools.cache
def _compiled(patterns: tuple[str, ...]) -> re.Pattern | None:
  if not patterns:
    return None
  try:
    return re.compile("|".join(f"(?:{p})" for p in patterns))
  except re.error as e:
    raise ValueError(f"bad source path pattern in {patterns!r}: {e}") from None


def is_library(file: str, library_paths: tuple[str, ...] = DEFAULT_LIBRARY_PATHS,
               user_paths: tuple[str, ...] = DEFAULT_USER_PATHS) -> bool:
  """Whether `file` is library code; `user_paths` wins over `library_paths`."""
  return _is_library(file, tuple(library_paths), tuple(user_paths))


@functools.lru_cache(maxsize=1 << 16)
def _is_library(file: str, library_paths: tuple[str, ...],
                user_paths: tuple[str, ...]) -> bool:
  # A model's thousands of frames come from a few hundred files.
  path = file.replace("\\", "/")
  user = _compiled(tuple(user_paths))
  if user is not None and user.search(path):
    return False
  lib = _compiled(tuple(library_paths))
  return lib is not None and lib.search(path) is not None


def user_frame(stack: tuple[SourceLocation, ...],
               library_paths: tuple[str, ...] = DEFAULT_LIBRARY_PATHS,
               user_paths: tuple[str, ...] = DEFAULT_USER_PATHS) -> SourceLocation | None:
  """The innermost frame of `stack` (innermost first) in the user's code, or
  the innermost frame when none is the user's; None for an empty stack."""
  for loc in stack:
    if loc.file and not is_library(loc.file, library_paths, user_paths):
      return loc
  return stack[0] if stack else None


#: The metadata JAX gives nearly every instruction: an op_name (escapes
#: allowed, as in parameters' `state.params[\'w\']`) and at most a frame id,
#: no source_file. `attributes.metadata` decodes this form without error
#: (its `_MD_COMMON`, else its field loop), so the frame id is read here
#: without building the Metadata (attribution asks it of every kernel and
#: buffer).
_COMMON_METADATA = re.compile(
    r'\{op_name="[^"\\]*+(?:\\.[^"\\]*+)*+"(?: stack_frame_id=([0-9]{1,18}))?\}')


def _frame_fields(inst: Instruction) -> tuple[int, Metadata | None]:
  """(stack_frame_id, the decoded metadata or None when it cannot name a
  source_file) of `inst`, as `inst.metadata` would give them."""
  raw = inst.attribute("metadata")
  if raw is None:
    return 0, None
  m = _COMMON_METADATA.fullmatch(raw)
  if m is not None:
    frame = m.group(1)
    return (int(frame) if frame else 0), None
  md = inst.metadata
  return md.stack_frame_id, md


def _file_stack(md: Metadata | None) -> tuple[SourceLocation, ...]:
  """The one-frame stack of a `source_file`/`source_line` metadata."""
  if md is not None and md.source_file and md.source_line:
    return (SourceLocation(file=md.source_file, line=md.source_line,
                           column=md.source_column),)
  return ()


#: (source, stack): an instruction's attribution.
_Found = tuple[SourceLocation | None, tuple[SourceLocation, ...]]
_NOTHING: _Found = (None, ())


class _Attribution:
  """A module's attributions under one (library_paths, user_paths), kept in
  the module's cache until `release_tables`: the answers by instruction
  name, each file's library test, and each StackFrames stack's user frame
  (thousands of instructions share a few hundred stacks). It holds no
  reference to the module: in the module's cache that would be a cycle."""

  __slots__ = ("library_paths", "user_paths", "answers", "library", "frames")

  def __init__(self, library_paths: tuple[str, ...], user_paths: tuple[str, ...]):
    self.library_paths = tuple(library_paths)
    self.user_paths = tuple(user_paths)
    #: instruction name -> (the instruction, its answer).
    self.answers: dict[str, tuple[Instruction, _Found]] = {}
    self.library: dict[str, bool] = {}
    #: stack_frame_id -> (user frame or None, its non-empty stack), or None
    #: when the frame has no stack.
    self.frames: dict[int, _Found | None] = {}

  def user_frame(self, stack: tuple[SourceLocation, ...]) -> SourceLocation | None:
    """The innermost user frame of `stack`, or None (no fallback)."""
    library = self.library
    for loc in stack:
      file = loc.file
      if file:
        lib = library.get(file)
        if lib is None:
          lib = library[file] = _is_library(file, self.library_paths, self.user_paths)
        if not lib:
          return loc
    return None

  def choice(self, module: HloModule, inst: Instruction) -> _Found:
    """(user frame or None, stack) of `inst`'s own stack, innermost first:
    the StackFrames chain of its `stack_frame_id`, else its
    `source_file`/`source_line` alone."""
    frame_id, md = _frame_fields(inst)
    if frame_id and module.stack_frame_index is not None:
      frames = self.frames
      if frame_id in frames:
        hit = frames[frame_id]
      else:
        stack = module.stack_frame_index.stack(frame_id)
        hit = frames[frame_id] = (self.user_frame(stack), stack) if stack else None
      if hit is not None:
        return hit
    stack = _file_stack(md)
    return (self.user_frame(stack), stack) if stack else _NOTHING

  def own(self, module: HloModule, inst: Instruction) -> _Found:
    """The first of `_candidates` with a user frame, else the innermost
    frame of the first with a stack."""
    fallback: tuple[SourceLocation, ...] = ()
    for cand in _candidates(module, inst):
      user, stack = self.choice(module, cand)
      if user is not None:
        return user, stack
      if stack and not fallback:
        fallback = stack
    return (fallback[0], fallback) if fallback else _NOTHING

  def attribute(self, module: HloModule, inst: Instruction) -> _Found:
    """`attribute(module, inst, ...)`, answered once per instruction."""
    hit = self.answers.get(inst.name)
    if hit is not None and hit[0] is inst:
      return hit[1]
    found = self.own(module, inst)
    if not found[1]:
      for other in _context(module, inst):
        found = self.own(module, other)
        if found[1]:
          break
      else:
        found = _NOTHING
    self.answers[inst.name] = (inst, found)
    return found


def _attribution(module: HloModule, library_paths: tuple[str, ...],
                 user_paths: tuple[str, ...]) -> _Attribution:
  # Kernels and buffers ask of the same instructions: answered once per
  # audit (dropped with the tables, `release_tables`).
  states = module._cached("source_memo", dict)
  key = (library_paths, user_paths)
  state = states.get(key)
  if state is None:
    state = states[key] = _Attribution(library_paths, user_paths)
  return state


def attribute(module: HloModule, inst: Instruction,
              library_paths: tuple[str, ...] = DEFAULT_LIBRARY_PATHS,
              user_paths: tuple[str, ...] = DEFAULT_USER_PATHS
              ) -> tuple[SourceLocation | None, tuple[SourceLocation, ...]]:
  """(source, stack) of `inst`: the user's frame and the stack it came from.

  A fusion's own metadata is tried first, then its fused instructions (root
  first); the first with a user frame wins, else the first with any frame.
  XLA-made instructions carry none (loop-carry and donation copies, layout
  copies): they take the stack of the loop that runs them, else of what
  they feed (through tuples and bitcasts), else of what they read.
  """
  return _attribution(module, library_paths, user_paths).attribute(module, inst)


def attributor(module: HloModule,
               library_paths: tuple[str, ...] = DEFAULT_LIBRARY_PATHS,
               user_paths: tuple[str, ...] = DEFAULT_USER_PATHS
               ) -> Callable[[Instruction], tuple[SourceLocation | None,
                                                  tuple[SourceLocation, ...]]]:
  """`attribute` of `module` under these paths, as a function of the
  instruction (for loops over thousands: the paths are looked up once)."""
  return functools.partial(_attribution(module, library_paths, user_paths).attribute,
                           module)


def _candidates(module: HloModule, inst: Instruction):
  """`inst`, then each fused computation's root and other instructions
  (lazily: the fusion's own metadata nearly always answers)."""
  yield inst
  for callee in inst.called_computations.get("calls", ()):
    if callee in module:
      comp = module.computation(callee)
      root = comp.root
      yield root
      for i in comp.instructions:
        if i is not root:
          yield i


_PASS_THROUGH = frozenset({"tuple", "get-tuple-element", "bitcast", "copy"})
#: Opcodes that call computations as control flow (a loop, a branch, an
#: async or custom call), not as the body of one kernel (calls=, to_apply=).
_CONTROL_FLOW = frozenset({"while", "conditional", "select-and-scatter", "custom-call",
                           "async-start", "async-update", "async-done"})
_KERNEL_ROLES = ("calls", "to_apply")


def _tables(module: HloModule):
  """(instruction name -> computation, computation -> (instruction name ->
  users), computation -> its control-flow callers), built once per module
  (dropped by `release_tables`): metadata-less instructions are many in big
  modules. Users are listed per computation on first need (operands are
  local to a computation), so fused bodies, most of the module, get none."""
  def build():
    comp_of, callers_of = {}, {}
    for c in module.computations:
      for i in c.instructions:
        comp_of[i.name] = c
        if i.opcode in _CONTROL_FLOW:
          for role, names in i.called_computations.items():
            if role not in _KERNEL_ROLES:
              for n in names:
                callers_of.setdefault(n, []).append((c.name, i))
    return comp_of, {}, callers_of
  return module._cached("source_tables", build)


def _users(users_by_comp: dict, comp: Computation) -> dict[str, list[Instruction]]:
  users = users_by_comp.get(comp.name)
  if users is None:
    users = users_by_comp[comp.name] = {}
    for i in comp.instructions:
      for o in dict.fromkeys(i.operands):
        users.setdefault(o, []).append(i)
  return users


def release_tables(module: HloModule) -> None:
  """Drops `module`'s attribution tables once an audit's findings have their
  sources: a report keeps the module, and the tables would add a fifth to
  what it holds."""
  module._forget("source_tables")
  module._forget("source_memo")


def _context(module: HloModule, inst: Instruction):
  """Instructions whose stack stands for `inst`'s: the control-flow callers
  of its computation (innermost first), its users (looking through tuples
  and bitcasts), then its operands."""
  comp_of, users_by_comp, callers_of = _tables(module)
  comp = comp_of.get(inst.name)
  if comp is None:
    return
  users_of = _users(users_by_comp, comp)
  name = comp.name
  seen = {name}
  while True:
    callers = callers_of.get(name)
    if not callers:
      break
    c, i = callers[0]
    yield i
    if c in seen:
      break
    seen.add(c)
    name = c
  frontier, visited = [inst.name], {inst.name}
  while frontier:
    nxt = []
    for name in frontier:
      for user in users_of.get(name, ()):
        if user.name not in visited:
          visited.add(user.name)
          yield user
          if user.opcode in _PASS_THROUGH:
            nxt.append(user.name)
    frontier = nxt
  for o in inst.operands:
    if o in comp:
      yield comp.instruction(o)


def library_name(file: str) -> str:
  """What a library frame's file belongs to: the installed package
  ("flax"), "python" for the standard library, else the file's basename."""
  path = file.replace("\\", "/")
  m = _INSTALLED.search(path)
  if m:
    return m.group(1).split(".")[0]
  if _STDLIB.search(path):
    return "python"
  for pkg in ("jax", "jaxlib", "hlo_audit"):
    if re.search(rf"(^|/){pkg}/", path):
      return pkg
  m = _SRC_PACKAGE.search(path)  # a kernel library's internals
  if m:
    return m.group(1)
  return path.rsplit("/", 1)[-1]


def context(source: SourceLocation | None, stack: tuple[SourceLocation, ...]) -> str:
  """The library frame the user's line called into, e.g. "in flax
  Linear.__call__ at nnx/nn/linear.py:422"; "" when `source` is innermost."""
  if source is None or not stack or stack[0] == source:
    return ""
  inner = stack[0]
  for loc in stack:
    if loc == source:
      break
    inner = loc  # the library frame the user's line called into
  parts = inner.file.replace("\\", "/").split("/")
  short = "/".join(parts[-3:])
  func = f" {inner.function}" if inner.function else ""
  return f"in {library_name(inner.file)}{func} at {short}:{inner.line}"

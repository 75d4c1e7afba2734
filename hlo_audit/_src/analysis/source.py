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

from hlo_audit._src.hlo.ir import HloModule, Instruction, SourceLocation

#: Regexes (searched in the '/'-separated path) of files that are not the
#: user's: installed packages, the standard library, jax and jaxlib from a
#: source checkout, this project's own internals, and Python's frozen modules.
DEFAULT_LIBRARY_PATHS: tuple[str, ...] = (
    r"/(site|dist)-packages/",
    r"/lib/python\d+(\.\d+)?t?/(?!(site|dist)-packages/)",
    r"(^|/)jax/_src/",
    r"(^|/)jaxlib/",
    r"(^|/)hlo_audit/_src/",
    r"(^|/)pallas_kernels/_src/",
    r"^<frozen ",
)

#: Regexes of files that are the user's wherever they are installed: the
#: built-in examples stand for user code.
DEFAULT_USER_PATHS: tuple[str, ...] = (r"(^|/)hlo_audit/_src/examples/",)

_INSTALLED = re.compile(r"/(?:site|dist)-packages/([^/]+)/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")


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


def instruction_stack(module: HloModule, inst: Instruction) -> tuple[SourceLocation, ...]:
  """`inst`'s stack, innermost first: the StackFrames chain of its
  `stack_frame_id`, else its `source_file`/`source_line` alone."""
  md = inst.metadata
  if md.stack_frame_id and module.stack_frame_index is not None:
    stack = module.stack_frame_index.stack(md.stack_frame_id)
    if stack:
      return stack
  if md.source_file and md.source_line:
    return (SourceLocation(file=md.source_file, line=md.source_line,
                           column=md.source_column),)
  return ()


def attribute(module: HloModule, inst: Instruction,
              library_paths: tuple[str, ...] = DEFAULT_LIBRARY_PATHS,
              user_paths: tuple[str, ...] = DEFAULT_USER_PATHS
              ) -> tuple[SourceLocation | None, tuple[SourceLocation, ...]]:
  """(source, stack) of `inst`: the user's frame and the stack it came from.

  A fusion's own metadata is tried first, then its fused instructions (root
  first); the first with a user frame wins, else the first with any frame.
  """
  candidates = [inst]
  for callee in inst.called_computations.get("calls", ()):
    if callee in module:
      comp = module.computation(callee)
      candidates += [comp.root] + [i for i in comp.instructions if i is not comp.root]
  fallback: tuple[SourceLocation, ...] = ()
  for cand in candidates:
    stack = instruction_stack(module, cand)
    if not stack:
      continue
    for loc in stack:
      if loc.file and not is_library(loc.file, library_paths, user_paths):
        return loc, stack
    if not fallback:
      fallback = stack
  if not fallback:
    # XLA drops metadata on what its passes add (a loop carry's copy, an
    # output copy): such an instruction belongs to what it copies, else to
    # the loop or call that runs its computation.
    for other in _stand_ins(module, inst):
      src, stack = attribute(module, other, library_paths, user_paths)
      if src is not None:
        return src, stack
  return (fallback[0], fallback) if fallback else (None, ())


def library_name(file: str) -> str:
  """What a library frame's file belongs to: the installed package
  ("flax"), "python" for the standard library, else the file's basename."""
  path = file.replace("\\", "/")
  m = _INSTALLED.search(path)
  if m:
    return m.group(1).split(".")[0]
  if _STDLIB.search(path):
    return "python"
  for pkg in ("jax", "jaxlib", "hlo_audit", "pallas_kernels"):
    if re.search(rf"(^|/){pkg}/", path):
      return pkg
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


#: Opcodes whose result is their operand's data: the source of that data.
_PASS_THROUGH = frozenset({"copy", "bitcast", "get-tuple-element", "convert",
                           "reshape", "transpose"})
_tables: dict[int, tuple[HloModule, dict, dict]] = {}


def _module_tables(module: HloModule):
  """(instruction -> its computation, computation -> its caller), built once
  per module (the audit in progress)."""
  cached = _tables.get(id(module))
  if cached is None or cached[0] is not module:
    comp_of = {i.name: c for c in module.computations for i in c.instructions}
    caller = {callee: i for c in module.computations for i in c.instructions
              if i.opcode in ("while", "call", "conditional", "async-start")
              for callees in i.called_computations.values() for callee in callees}
    _tables.clear()
    _tables[id(module)] = cached = (module, comp_of, caller)
  return cached[1], cached[2]


def _stand_ins(module: HloModule, inst: Instruction) -> list[Instruction]:
  """What to attribute a metadata-less `inst` to: the producer of the data
  it passes through, then the instruction calling its computation."""
  comp_of, caller_of = _module_tables(module)
  comp = comp_of.get(inst.name)
  if comp is None:
    return []
  out = []
  if inst.opcode in _PASS_THROUGH and inst.operands and inst.operands[0] in comp:
    operand = comp.instruction(inst.operands[0])
    if operand.opcode != "parameter":
      out.append(operand)
  caller = caller_of.get(comp.name)
  if caller is not None:
    out.append(caller)
  return out

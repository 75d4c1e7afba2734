"""Mutation score of the tests: how many of the slips developers make they catch.

Generated mutants of the usual kind (an operator, a constant, a deleted call)
are mostly caught by any test that runs the line, so their score says little:
mutmut scored these tests 85-90% while they caught 6 of 14 one-line slips put
in by hand. This script makes the slips themselves, one edit at one line, with
operators of its own (`OPERATORS`, read off the AST, applied to the line's
text so everything else stays as written):

  swap_args      two neighbouring positional arguments of a call swapped
  swap_compare   the two operands of an ordering comparison swapped
  boundary       `<` for `<=`, `>` for `>=` and back
  neighbour_name a local or parameter used in place of another one nearby
  drop_term      one term of a guard's `and`/`or` dropped
  any_all        `any` for `all` and back
  sort_order     a sort key's minus sign dropped, or `reverse=True` toggled
  get_default    a `.get(k, default)`'s default changed
  dict_key       a string key of a mapping read as a neighbouring key of it

Each package folder of `[tool.bench_mutation.folders]` in pyproject.toml
names its sources and the tests that own them; hlo_audit's folders also run
the whole-audit snapshots. Per folder a seeded sample is drawn, round robin
over the operators (so a small sample still spans them), and each mutant is
written into a scratch copy of the checkout (one per job; the checkout itself
is never touched) and judged by `python -m pytest -x -q` over the folder's
tests: killed (a test fails or the run times out), survived, or invalid (the
module no longer imports: not counted). With coverage installed, the tests
that run the mutant's line go first (`Reach`); only what survives them runs
the folder's whole tests. The score is killed / (killed +
survived) with a Wilson 95% interval; results.json holds every mutant and
survivors.md each survivor's diff: a test to write, or an equivalent mutant
to list under `[tool.bench_mutation.equivalent]` with why.

Example:
  python scripts/bench_mutation.py --folders hlo,report --sample 8 --seed 1 \\
      --jobs 1 --out /tmp/mutation
  python scripts/bench_mutation.py --mutants '*/hlo/parser.py:412:*' \\
      --out /tmp/mutation   # re-run survivors after writing their tests
  python scripts/bench_mutation.py --folders audit --sample 0 \\
      --operators any_all,sort_order,drop_term   # every mutant of the rarer slips
"""

from __future__ import annotations

import ast
import collections
import concurrent.futures
import dataclasses
import difflib
import fnmatch
import importlib.util
import json
import math
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator

from absl import app
from absl import flags

_FOLDERS = flags.DEFINE_list("folders", None,
                             "Package folders to mutate (default: every folder of the table).")
_SAMPLE = flags.DEFINE_integer("sample", 20, "Mutants run per folder (0: all of them).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the sample.")
_JOBS = flags.DEFINE_integer("jobs", 1, "Mutants judged at once (one scratch copy each).")
_MUTANTS = flags.DEFINE_list(
    "mutants", [], "Run these mutants (ids as results.json and survivors.md give them, "
    "fnmatch patterns allowed) instead of a sample: to check that new tests kill them.")
_CONFIRM = flags.DEFINE_bool(
    "confirm", True, "Run the folder's whole tests on what survives its line's own tests "
    "(--noconfirm: a quicker look for survivors, whose score is only a floor).")
_OPERATORS = flags.DEFINE_list(
    "operators", [], "Only these operators' mutants (default: all): with --sample 0, every "
    "mutant of the rarer slips, which a round-robin sample weighs as much as the commonest.")
_OUT = flags.DEFINE_string("out", None, "Folder for results.json and survivors.md.")
_TIMEOUT = flags.DEFINE_float(
    "timeout_factor", 3.0, "A mutant's tests time out (and count as killed) after this "
    "many times the unmutated run, plus a minute.")
_LIST = flags.DEFINE_bool("list", False, "Only list the sampled mutants.")
_SELECT = flags.DEFINE_bool(
    "select", True, "With coverage installed, run the tests that run a mutant's line first; "
    "the folder's whole tests judge only what survives them.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")


# -- the mutator -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mutant:
  """One edit at one line of one file."""

  path: str  # relative to the repository root
  line: int  # 1-based
  operator: str
  index: int  # among this line's mutants of this operator: keeps ids unique
  before: str  # the line as written
  after: str  # the line mutated

  @property
  def id(self) -> str:
    return f"{self.path}:{self.line}:{self.operator}:{self.index}"

  @property
  def key(self) -> str:
    """What `[tool.bench_mutation.equivalent]` names: stable while lines move."""
    return f"{self.path} {self.operator}: {self.before.strip()} -> {self.after.strip()}"

  def describe(self) -> str:
    return f"{self.path}:{self.line} {self.operator}: {self.before.strip()} -> {self.after.strip()}"

  def apply(self, source: str) -> str:
    lines = source.splitlines(keepends=True)
    old = lines[self.line - 1]
    if old.rstrip("\r\n") != self.before:
      raise ValueError(f"{self.id}: the line changed since the mutant was made")
    lines[self.line - 1] = self.after + old[len(old.rstrip("\r\n")):]
    return "".join(lines)

  def diff(self, source: str) -> str:
    return "".join(difflib.unified_diff(
        source.splitlines(keepends=True), self.apply(source).splitlines(keepends=True),
        f"a/{self.path}", f"b/{self.path}", n=2))


@dataclasses.dataclass(frozen=True)
class _Edit:
  """Replace bytes [start, end) of a line (ast's offsets are UTF-8 bytes)."""

  line: int
  start: int
  end: int
  text: str


# Calls whose arguments commute: swapping them is no slip anyone can see.
_SYMMETRIC = frozenset({
    "max", "min", "maximum", "minimum", "add", "multiply", "gcd", "lcm", "hypot", "isclose",
    "allclose", "array_equal", "logical_and", "logical_or", "logical_xor", "union",
    "intersection", "print", "assertEqual", "bitwise_and", "bitwise_or",
})
_ORDERING = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_SORTS = frozenset({"sorted", "sort"})


def _one_line(node: ast.AST) -> bool:
  return getattr(node, "lineno", None) is not None and node.lineno == node.end_lineno


def _seg(lines: list[bytes], node: ast.AST) -> str:
  return lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode()


def _call_name(call: ast.Call) -> str | None:
  f = call.func
  return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _paren(node: ast.AST, text: str) -> str:
  """`text` of node, parenthesized where it binds looser than `and`/`or`'s operands."""
  return f"({text})" if isinstance(node, (ast.BoolOp, ast.IfExp, ast.Lambda,
                                          ast.NamedExpr)) else text


class _Scopes:
  """Per function: its locals and parameters with the lines they occur at."""

  def __init__(self, tree: ast.AST):
    self.uses: list[tuple[ast.Name, ast.AST]] = []  # (a local read, its function)
    self.occurs: dict[int, dict[str, list[int]]] = {}  # id(function) -> name -> lines
    self.first_bound: dict[int, dict[str, int]] = {}
    self.annotation: dict[int, dict[str, str]] = {}
    self.called: dict[int, set[str]] = {}
    for fn in ast.walk(tree):
      if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self._function(fn)

  def _function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    key = id(fn)
    occurs: dict[str, list[int]] = collections.defaultdict(list)
    bound: dict[str, int] = {}
    notes: dict[str, str] = {}
    a = fn.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
      if arg is not None and arg.arg not in ("self", "cls"):
        bound[arg.arg] = fn.lineno
        occurs[arg.arg].append(arg.lineno)
        if arg.annotation is not None:
          notes[arg.arg] = ast.unparse(arg.annotation)
    reads: list[ast.Name] = []
    called: set[str] = set()
    for node in _own_nodes(fn):
      if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Store):
          bound[node.id] = min(bound.get(node.id, node.lineno), node.lineno)
          occurs[node.id].append(node.lineno)
        elif isinstance(node.ctx, ast.Load):
          reads.append(node)
      elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        called.add(node.func.id)
    for node in reads:
      if node.id in bound:
        occurs[node.id].append(node.lineno)
        self.uses.append((node, fn))
    self.occurs[key] = occurs
    self.first_bound[key] = bound
    self.annotation[key] = notes
    self.called[key] = called

  def neighbour(self, use: ast.Name, fn: ast.AST, window: int = 4) -> str | None:
    """The local nearest the read (by the lines either occurs at) that could be
    read there instead: bound before it, of the same annotation, and called
    only where the read one is."""
    key = id(fn)
    best: tuple[int, int, str] | None = None
    for name, lines in self.occurs[key].items():
      if name in (use.id, "_") or self.first_bound[key][name] >= use.lineno:
        continue  # the same name, or one unbound where it would be read
      notes = self.annotation[key]
      if name in notes and use.id in notes and notes[name] != notes[use.id]:
        continue
      if (name in self.called[key]) != (use.id in self.called[key]):
        continue
      gap = min(abs(line - use.lineno) for line in lines)
      if gap <= window:
        # Nearest first; among equals, the one bound latest (the likelier mix-up).
        cand = (gap, -self.first_bound[key][name], name)
        if best is None or cand < best:
          best = cand
    return best[2] if best else None


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
  """The nodes of fn's body outside nested functions, classes, lambdas and
  comprehensions (their names are theirs) and outside annotations."""
  todo = list(fn.body)
  while todo:
    node = todo.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
      continue
    yield node
    for name, child in ast.iter_fields(node):
      if name in ("annotation", "returns"):
        continue
      for c in child if isinstance(child, list) else [child]:
        if isinstance(c, ast.AST):
          todo.append(c)


def _annotation_nodes(tree: ast.AST) -> set[int]:
  """Nodes inside annotations: never evaluated (`from __future__ import annotations`)."""
  out: set[int] = set()
  for node in ast.walk(tree):
    notes = []
    if isinstance(node, ast.arg) and node.annotation is not None:
      notes.append(node.annotation)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
      notes.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
      notes.append(node.annotation)
    for n in notes:
      out.update(id(x) for x in ast.walk(n))
  return out


def _guards(tree: ast.AST) -> Iterator[ast.AST]:
  for node in ast.walk(tree):
    if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
      yield node.test
    elif isinstance(node, ast.comprehension):
      yield from node.ifs


def _edits(tree: ast.AST, lines: list[bytes]) -> Iterator[tuple[str, _Edit]]:
  """(operator, edit) for every slip the operators make in a module."""
  skip = _annotation_nodes(tree)
  for node in ast.walk(tree):
    if id(node) in skip:
      continue
    if isinstance(node, ast.Call):
      yield from _call_edits(node, lines)
    elif isinstance(node, ast.Compare):
      yield from _compare_edits(node, lines)
  for test in _guards(tree):
    for node in ast.walk(test):
      if isinstance(node, ast.BoolOp) and _one_line(node):
        word = " and " if isinstance(node.op, ast.And) else " or "
        for drop in range(len(node.values)):
          kept = [_paren(v, _seg(lines, v)) for i, v in enumerate(node.values) if i != drop]
          yield "drop_term", _Edit(node.lineno, node.col_offset, node.end_col_offset,
                                   word.join(kept))
  scopes = _Scopes(tree)
  for use, fn in scopes.uses:
    if id(use) not in skip:
      other = scopes.neighbour(use, fn)
      if other:
        yield "neighbour_name", _Edit(use.lineno, use.col_offset, use.end_col_offset, other)
  yield from _key_edits(tree, lines, skip)


def _call_edits(call: ast.Call, lines: list[bytes]) -> Iterator[tuple[str, _Edit]]:
  name = _call_name(call)
  args = call.args
  if name not in _SYMMETRIC:
    for a, b in zip(args, args[1:]):
      if (not isinstance(a, ast.Starred) and not isinstance(b, ast.Starred) and _one_line(a)
          and _one_line(b) and a.lineno == b.lineno and _seg(lines, a) != _seg(lines, b)):
        line = lines[a.lineno - 1]
        middle = line[a.end_col_offset:b.col_offset].decode()
        yield "swap_args", _Edit(a.lineno, a.col_offset, b.end_col_offset,
                                 _seg(lines, b) + middle + _seg(lines, a))
  if name in ("any", "all"):
    f = call.func
    other = "all" if name == "any" else "any"
    if isinstance(f, ast.Name):
      yield "any_all", _Edit(f.lineno, f.col_offset, f.end_col_offset, other)
    elif _one_line(f):
      yield "any_all", _Edit(f.lineno, f.end_col_offset - len(name), f.end_col_offset, other)
  if name in _SORTS:
    yield from _sort_edits(call, lines)
  if name == "get" and isinstance(call.func, ast.Attribute) and len(args) == 2:
    yield from _default_edits(args[1], lines)


def _sort_edits(call: ast.Call, lines: list[bytes]) -> Iterator[tuple[str, _Edit]]:
  reverse = next((k for k in call.keywords if k.arg == "reverse"), None)
  if reverse is not None:
    v = reverse.value
    if isinstance(v, ast.Constant) and isinstance(v.value, bool) and _one_line(v):
      yield "sort_order", _Edit(v.lineno, v.col_offset, v.end_col_offset, str(not v.value))
  elif _one_line(call) and (call.args or call.keywords):
    # `reverse=True` added before the closing parenthesis.
    line = lines[call.lineno - 1]
    close = call.end_col_offset - 1
    inner = line[call.col_offset:close].decode().rstrip()
    comma = "" if inner.endswith(",") else ", "
    yield "sort_order", _Edit(call.lineno, call.col_offset, call.end_col_offset,
                              f"{inner}{comma}reverse=True)")
  key = next((k for k in call.keywords if k.arg == "key"), None)
  if key is not None and isinstance(key.value, ast.Lambda):
    body = key.value.body
    terms = body.elts if isinstance(body, ast.Tuple) else [body]
    for t in terms:
      if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.USub) and _one_line(t):
        yield "sort_order", _Edit(t.lineno, t.col_offset, t.end_col_offset,
                                  _seg(lines, t.operand))


def _default_edits(default: ast.AST, lines: list[bytes]) -> Iterator[tuple[str, _Edit]]:
  if not _one_line(default):
    return
  new: str | None = None
  if isinstance(default, ast.Constant):
    v = default.value
    if isinstance(v, bool):
      new = str(not v)
    elif isinstance(v, (int, float)):
      new = "1" if v == 0 else "0"
    elif isinstance(v, str):
      new = '""' if v else None
    elif v is None:
      new = "0"
  elif isinstance(default, (ast.List, ast.Tuple, ast.Dict, ast.Set)):
    new = "None"  # an empty container where None was expected, or back
  elif isinstance(default, ast.UnaryOp) and isinstance(default.operand, ast.Constant):
    new = "0"
  else:
    new = "None"
  if new is not None and new != _seg(lines, default):
    yield "get_default", _Edit(default.lineno, default.col_offset, default.end_col_offset, new)


def _key_edits(tree: ast.AST, lines: list[bytes], skip: set[int]
               ) -> Iterator[tuple[str, _Edit]]:
  """A mapping's string key read as the nearest other key the same function
  (or module) reads of the same mapping: `d["rows"]` for `d["cols"]`."""
  for scope in ast.walk(tree):
    if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    nodes = _own_nodes(scope) if not isinstance(scope, ast.Module) else _module_nodes(scope)
    reads: dict[str, list[ast.Constant]] = collections.defaultdict(list)
    for node in nodes:
      if id(node) in skip:
        continue
      target, key = None, None
      if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        target, key = node.value, node.slice
      elif (isinstance(node, ast.Call) and _call_name(node) in ("get", "pop", "setdefault")
            and isinstance(node.func, ast.Attribute) and node.args
            and isinstance(node.args[0], ast.Constant)):
        target, key = node.func.value, node.args[0]
      if key is not None and isinstance(key.value, str) and _one_line(key):
        reads[ast.dump(target)].append(key)
    for keys in reads.values():
      for key in keys:
        others = [k for k in keys if k.value != key.value]
        if others:
          near = min(others, key=lambda k: (abs(k.lineno - key.lineno), k.lineno))
          yield "dict_key", _Edit(key.lineno, key.col_offset, key.end_col_offset,
                                  _seg(lines, near))


def _module_nodes(module: ast.Module) -> Iterator[ast.AST]:
  """Module-level nodes outside functions and classes."""
  todo: list[ast.AST] = list(module.body)
  while todo:
    node = todo.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
      continue
    yield node
    todo.extend(ast.iter_child_nodes(node))


def _compare_edits(cmp: ast.Compare, lines: list[bytes]) -> Iterator[tuple[str, _Edit]]:
  operands = [cmp.left, *cmp.comparators]
  for op, a, b in zip(cmp.ops, operands, operands[1:]):
    sym = _ORDERING.get(type(op))
    if sym is None or not (_one_line(a) and _one_line(b) and a.lineno == b.lineno):
      continue
    line = lines[a.lineno - 1]
    middle = line[a.end_col_offset:b.col_offset].decode()
    at = middle.find(sym)
    if at < 0:
      continue
    start = a.end_col_offset + len(middle[:at].encode())
    yield "boundary", _Edit(a.lineno, start, start + len(sym), _BOUNDARY[sym])
    if len(cmp.ops) == 1 and _seg(lines, a) != _seg(lines, b):
      yield "swap_compare", _Edit(a.lineno, a.col_offset, b.end_col_offset,
                                  _seg(lines, b) + middle + _seg(lines, a))


OPERATORS = ("swap_args", "swap_compare", "boundary", "neighbour_name", "drop_term",
             "any_all", "sort_order", "get_default", "dict_key")


def mutants(source: str, path: str = "<string>") -> list[Mutant]:
  """Every mutant of a module, in line order; none is a no-op: each one's AST
  differs from the original's (and from every other mutant's)."""
  tree = ast.parse(source)
  text_lines = source.splitlines()
  lines = [t.encode() for t in text_lines]
  original = ast.dump(tree)
  seen: set[str] = set()
  made: list[tuple[int, str, str, str]] = []
  for op, e in _edits(tree, lines):
    raw = lines[e.line - 1]
    after = (raw[:e.start] + e.text.encode() + raw[e.end:]).decode()
    if after == text_lines[e.line - 1]:
      continue
    new = "\n".join([*text_lines[:e.line - 1], after, *text_lines[e.line:]])
    try:
      dump = ast.dump(ast.parse(new))
    except SyntaxError:
      continue
    if dump == original or dump in seen:
      continue
    seen.add(dump)
    made.append((e.line, op, text_lines[e.line - 1], after))
  made.sort(key=lambda m: (m[0], OPERATORS.index(m[1]), m[3]))
  out: list[Mutant] = []
  count: collections.Counter[tuple[int, str]] = collections.Counter()
  for line, op, before, after in made:
    out.append(Mutant(path, line, op, count[line, op], before, after))
    count[line, op] += 1
  return out


# -- the folders and their tests ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Folder:
  """Sources to mutate and the tests that own them."""

  name: str
  sources: tuple[str, ...]
  tests: tuple[str, ...]
  #: Whether the mutants' runs share one persistent JAX compilation cache
  #: (filled by the unmutated run); off where a test reads what only a real
  #: compile writes (XLA's dump reports).
  compilation_cache: bool = False


def load_config(root: str = ROOT) -> tuple[dict[str, Folder], dict[str, str]]:
  """pyproject.toml's `[tool.bench_mutation]`: the folders, and the mutants
  known equivalent (their `Mutant.key`) with why."""
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    table = tomllib.load(f)["tool"]["bench_mutation"]
  folders = {name: Folder(name, tuple(g["sources"]), tuple(g["tests"]),
                          bool(g.get("compilation_cache", False)))
             for name, g in table["folders"].items()}
  return folders, dict(table.get("equivalent", {}))


def source_files(folder: Folder, root: str = ROOT) -> list[str]:
  out = []
  for src in folder.sources:
    full = os.path.join(root, src)
    if os.path.isfile(full):
      out.append(src)
      continue
    for d, _, names in os.walk(full):
      out.extend(os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".py"))
  return sorted(out)


def folder_mutants(folder: Folder, equivalent: dict[str, str], root: str = ROOT
                   ) -> list[Mutant]:
  out = []
  for path in source_files(folder, root):
    with open(os.path.join(root, path)) as f:
      out.extend(m for m in mutants(f.read(), path) if m.key not in equivalent)
  return out


def sample(all_mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
  """n mutants, round robin over the operators in a seeded order, each
  operator's mutants shuffled: a sample of 8 spans the operators rather than
  the commonest one (a name read is far commoner than an `any`)."""
  if not n or n >= len(all_mutants):
    return list(all_mutants)
  rng = random.Random(seed)
  by_op: dict[str, list[Mutant]] = collections.defaultdict(list)
  for m in all_mutants:
    by_op[m.operator].append(m)
  ops = sorted(by_op)
  rng.shuffle(ops)
  for op in ops:
    rng.shuffle(by_op[op])
  out: list[Mutant] = []
  while len(out) < n:
    for op in ops:
      if by_op[op] and len(out) < n:
        out.append(by_op[op].pop())
  return out


# -- which tests run a line --------------------------------------------------

# A pytest plugin for the unmutated run under coverage: each test's lines
# (setup, call and teardown) are filed under its node id; what runs outside
# a test (imports while collecting) under "".
_CONTEXTS_PLUGIN = """\
import coverage
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  cov = coverage.Coverage.current()
  if cov is not None:
    cov.switch_context(item.nodeid)
  yield
  if cov is not None:
    cov.switch_context("")
"""
_PLUGIN = "bench_mutation_contexts"


def statement_lines(source: str) -> dict[int, tuple[int, int]]:
  """Each line's innermost statement, as (first, last) lines; a compound
  statement's is its header. A mutant's line is run when any line of its
  statement is (the tracer files a statement under the lines its code runs
  at, not always the edited one)."""
  out: dict[int, tuple[int, int]] = {}
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.stmt):
      continue
    first, last = node.lineno, node.end_lineno or node.lineno
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
      last = max(first, body[0].lineno - 1)
      decorators = getattr(node, "decorator_list", ())
      if decorators:  # the decorators run with the header
        first = min(first, *(d.lineno for d in decorators))
    for line in range(first, last + 1):
      have = out.get(line)
      if have is None or have[1] - have[0] >= last - first:
        out[line] = (first, last)
  return out


@dataclasses.dataclass(frozen=True)
class Reach:
  """Which of the folder's tests run each line, from one unmutated run under
  coverage: `tests_of` a mutant is its statement's tests ("" for a run
  outside any test, such as an import), empty where none runs it."""

  #: path (relative to the root) -> line -> the node ids that ran it
  lines: dict[str, dict[int, frozenset[str]]]
  statements: dict[str, dict[int, tuple[int, int]]]

  def tests_of(self, m: Mutant) -> frozenset[str]:
    ran = self.lines.get(m.path, {})
    first, last = self.statements.get(m.path, {}).get(m.line, (m.line, m.line))
    return frozenset().union(*(ran.get(line, ()) for line in range(first, last + 1)))

  @classmethod
  def read(cls, data_file: str, work: str, paths: list[str]) -> "Reach":
    import coverage  # pylint: disable=import-outside-toplevel
    data = coverage.CoverageData(basename=data_file)
    data.read()
    measured = {os.path.realpath(f): f for f in data.measured_files()}
    lines, statements = {}, {}
    for rel in paths:
      full = os.path.realpath(os.path.join(work, rel))
      with open(full) as f:
        statements[rel] = statement_lines(f.read())
      by_line = data.contexts_by_lineno(measured[full]) if full in measured else {}
      lines[rel] = {line: frozenset(c) for line, c in by_line.items()}
    return cls(lines, statements)


def _coverage_installed() -> bool:
  return importlib.util.find_spec("coverage") is not None


# -- judging -----------------------------------------------------------------


def _copy_project(dest: str) -> None:
  """Tracked and untracked (not ignored) files of the checkout, into dest."""
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode().split("\0")
  for rel in filter(None, files):
    src = os.path.join(ROOT, rel)
    if os.path.isfile(src):
      os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
      shutil.copy2(src, os.path.join(dest, rel))


def _env(work: str, folder: Folder) -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore",
             # The copy's packages, ahead of the editable install's finder
             # (which sits after the path finder): pytest imports the plugin
             # entry point before its own `pythonpath` applies.
             PYTHONPATH=work,
             # A mutant and its restored original can share a size and an
             # mtime second: a stale .pyc would run the wrong one.
             PYTHONDONTWRITEBYTECODE="1")
  corpus = os.path.join(ROOT, "..", "shared", "hlo_corpus")
  if "HLO_CORPUS" not in env and os.path.isfile(os.path.join(corpus, "INDEX.tsv")):
    # The parser's corpus tests find it beside the checkout, not beside the copy.
    env["HLO_CORPUS"] = os.path.abspath(corpus)
  if folder.compilation_cache:
    env.update(JAX_COMPILATION_CACHE_DIR=os.path.join(work, ".jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


def _pytest(work: str, folder: Folder, timeout: float | None,
            tests: frozenset[str] | None = None, coverage_dir: str | None = None
            ) -> tuple[int | None, float, str]:
  """(exit code or None on timeout, seconds, output tail). `tests`: these
  node ids, not the folder's tests (from a file: they can be thousands);
  `coverage_dir`: the run under coverage, each test's lines under its id."""
  t0 = time.perf_counter()
  args = list(folder.tests)
  if tests is not None:
    fd, listing = tempfile.mkstemp(prefix="mutation-tests-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
      f.write("\n".join(sorted(tests)) + "\n")
    args = [f"@{listing}"]
  command = [sys.executable, *PYTEST, *args]
  env = _env(work, folder)
  if coverage_dir is not None:
    with open(os.path.join(coverage_dir, f"{_PLUGIN}.py"), "w") as f:
      f.write(_CONTEXTS_PLUGIN)
    sources = sorted({os.path.join(work, s if os.path.isdir(os.path.join(work, s))
                                   else os.path.dirname(s)) for s in folder.sources})
    with open(os.path.join(coverage_dir, "coveragerc"), "w") as f:
      f.write(f"[run]\ndata_file = {os.path.join(coverage_dir, 'coverage.db')}\n"
              f"source =\n" + "".join(f"  {s}\n" for s in sources))
    command = [sys.executable, "-m", "coverage", "run",
               f"--rcfile={os.path.join(coverage_dir, 'coveragerc')}", *PYTEST,
               "-p", _PLUGIN, *args]
    env["PYTHONPATH"] = os.pathsep.join([work, coverage_dir])
  proc = subprocess.Popen(command, cwd=work,
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, time.perf_counter() - t0, out[-3000:]
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)  # the whole session: pytest and what it started
    proc.communicate()
    return None, time.perf_counter() - t0, ""
  finally:
    if tests is not None:
      os.unlink(listing)


def _imports(work: str, folder: Folder, path: str) -> bool:
  module = path[:-3].replace(os.sep, ".").removesuffix(".__init__")
  return subprocess.run([sys.executable, "-c", f"import {module}"], cwd=work,
                        env=_env(work, folder), capture_output=True).returncode == 0


def judge(work: str, folder: Folder, m: Mutant, timeout: float,
          reach: Reach | None = None, confirm: bool = True) -> dict:
  """Writes the mutant into the copy at work, runs the folder's tests, puts
  the original back. With `reach`, a line only tests run goes to those tests
  first: killed there, it is killed. Whatever survives them, and a line run
  outside any test (an import) or by none that coverage saw (a subprocess's
  line, say), goes to the folder's whole tests: a test can read what another
  test's run left (a cached fixture), so only the whole run says survived;
  without `confirm`, the line's own tests say it (a floor on the score)."""
  tests = None if reach is None else reach.tests_of(m)
  full = os.path.join(work, m.path)
  with open(full) as f:
    original = f.read()
  record = {"id": m.id, "mutant": m.describe(), "operator": m.operator}
  if tests is not None:
    record["reached"] = bool(tests)
  try:
    with open(full, "w") as f:
      f.write(m.apply(original))
    seconds = 0.0
    runs = ([tests, None] if confirm else [tests]) if tests and "" not in tests else [None]
    for run in runs:
      code, took, tail = _pytest(work, folder, timeout, run)
      seconds += took
      if code != 0:
        break
    if code is None:
      status = "timeout"
    elif code == 0:
      status = "survived"
    elif code in (1, 2):  # tests failed; or collection failed, an import perhaps
      status = "killed" if _imports(work, folder, m.path) else "invalid"
    else:  # pytest's own error, or no tests: nothing judged
      status = "error"
  finally:
    with open(full, "w") as f:
      f.write(original)
  if tests is not None:
    record["tests_run"] = "all" if run is None else len(run)
  return {**record, "status": status, "seconds": round(seconds, 1),
          "diff": m.diff(original), **({"output": tail} if status == "error" else {})}


_KILLED = ("killed", "timeout")


def wilson(k: int, n: int) -> tuple[float, float]:
  if n == 0:
    return 0.0, 1.0
  z, p = 1.96, k / n
  d = 1 + z * z / n
  c = (p + z * z / (2 * n)) / d
  h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
  return max(0.0, c - h), min(1.0, c + h)


def run_folder(folder: Folder, chosen: list[Mutant], everything: list[Mutant], jobs: int,
               timeout_factor: float, select: bool = False, confirm: bool = True) -> dict:
  total = len(everything)
  t0 = time.perf_counter()
  copies = [tempfile.mkdtemp(prefix=f"mutation-{folder.name}-") for _ in range(jobs)]
  try:
    for c in copies:
      _copy_project(c)
    # The copy must be what the tests import, and they must pass unmutated
    # there, or every mutant would read as killed.
    probe = subprocess.run(
        [sys.executable, "-c", "import hlo_audit, pallas_kernels; "
         "print(hlo_audit.__file__); print(pallas_kernels.__file__)"],
        cwd=copies[0], env=_env(copies[0], folder), capture_output=True, text=True)
    if probe.returncode or any(not p.startswith(copies[0]) for p in probe.stdout.split()):
      raise RuntimeError(f"the scratch copy's packages are not the ones imported:\n"
                         f"{probe.stdout}{probe.stderr}")
    coverage_dir = tempfile.mkdtemp(prefix=f"mutation-{folder.name}-coverage-") if select else None
    try:
      code, base, tail = _pytest(copies[0], folder, None, coverage_dir=coverage_dir)
      if code != 0:
        raise RuntimeError(f"the tests of {folder.name} fail unmutated (exit {code}):\n{tail}")
      reach = None
      if select:
        reach = Reach.read(os.path.join(coverage_dir, "coverage.db"), copies[0],
                           sorted({m.path for m in everything}))
    finally:
      if coverage_dir:
        shutil.rmtree(coverage_dir, ignore_errors=True)
    # (Under coverage the unmutated run is slower: the timeout only grows.)
    timeout = timeout_factor * base + 60
    reached = None
    if reach is not None:
      reached = sum(1 for m in everything if reach.tests_of(m))
      print(f"{folder.name}: the folder's tests run the lines of {reached} of {total} "
            f"mutants ({100 * reached / max(1, total):.1f}%)", flush=True)
    print(f"{folder.name}: unmutated tests {base:.0f} s; {len(chosen)} mutants, "
          f"timeout {timeout:.0f} s each", flush=True)
    free: queue.Queue[str] = queue.Queue()
    for c in copies:
      free.put(c)

    def one(m: Mutant) -> dict:
      work = free.get()
      try:
        r = judge(work, folder, m, timeout, reach, confirm)
      finally:
        free.put(work)
      how = "no test runs it: " if r.get("reached") is False else ""
      print(f"  {r['status']:8s} {r['seconds']:6.0f} s  {how}{r['mutant']}", flush=True)
      return r

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
      results = list(pool.map(one, chosen))
  finally:
    for c in copies:
      shutil.rmtree(c, ignore_errors=True)
  counts = collections.Counter(r["status"] for r in results)
  killed = sum(counts[s] for s in _KILLED)
  judged = killed + counts["survived"]
  lo, hi = wilson(killed, judged)
  return {"folder": folder.name, "sources": list(folder.sources), "tests": list(folder.tests),
          "mutants": total, "sampled": len(chosen), "counts": dict(counts),
          "killed": killed, "judged": judged, "score": killed / judged if judged else None,
          "interval": [lo, hi], "baseline_seconds": round(base, 1),
          "unreached": sum(1 for r in results if r.get("reached") is False),
          "confirmed": confirm,
          **({"reached": reached} if reached is not None else {}),
          "seconds": round(time.perf_counter() - t0), "results": results}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  folders, equivalent = load_config()
  names = _FOLDERS.value or list(folders)
  unknown = [n for n in names if n not in folders]
  if unknown:
    raise app.UsageError(f"unknown folders {unknown}; known: {', '.join(folders)}")
  bad = [o for o in _OPERATORS.value if o not in OPERATORS]
  if bad:
    raise app.UsageError(f"unknown operators {bad}; known: {', '.join(OPERATORS)}")
  plan = []
  for name in names:
    everything = folder_mutants(folders[name], equivalent)
    if _OPERATORS.value:
      everything = [m for m in everything if m.operator in _OPERATORS.value]
    if _MUTANTS.value:
      chosen = [m for m in everything
                if any(fnmatch.fnmatchcase(m.id, p) for p in _MUTANTS.value)]
    else:
      chosen = sample(everything, _SAMPLE.value, _SEED.value)
    if chosen:
      plan.append((folders[name], chosen, everything))
  if _LIST.value:
    for folder, chosen, everything in plan:
      print(f"{folder.name}: {len(chosen)} of {len(everything)}")
      for m in chosen:
        print(f"  {m.id}  {m.describe()}")
    return 0
  select = _SELECT.value and _coverage_installed()
  if _SELECT.value and not select:
    print("coverage is not installed: every mutant runs its folder's whole tests "
          "(pip install coverage to run a line's own tests first)", flush=True)
  results = []
  for folder, chosen, everything in plan:
    results.append(run_folder(folder, chosen, everything, max(1, _JOBS.value),
                              _TIMEOUT.value, select, _CONFIRM.value or not select))
  print(f"\n{'folder':10s} {'killed':>8s}  score (95% interval)  sample of mutants")
  for r in results:
    lo, hi = r["interval"]
    score = f"{100 * r['score']:.0f}%" if r["score"] is not None else "-"
    print(f"{r['folder']:10s} {r['killed']:3d}/{r['judged']:<4d} {score:>5s} "
          f"({100 * lo:.0f}-{100 * hi:.0f}%)      {r['sampled']} of {r['mutants']}; "
          f"{dict(r['counts'])}; {r['seconds']} s"
          + (f"; lines run by its tests: {100 * r['reached'] / max(1, r['mutants']):.1f}% "
             f"of all" if "reached" in r else "")
          + ("" if r["confirmed"] else "; survivors not confirmed: the score is a floor"))
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
    with open(os.path.join(_OUT.value, "survivors.md"), "w") as f:
      for r in results:
        f.write(f"# {r['folder']}\n\n")
        for s in r["results"]:
          if s["status"] == "survived":
            note = ("No test of the folder runs this line (in pytest's own process).\n\n"
                    if s.get("reached") is False else "")
            f.write(f"## {s['id']}\n\n{s['mutant']}\n\n{note}"
                    f"```diff\n{s['diff'].strip()}\n```\n\n")
  if not plan:
    print("no mutant matched", file=sys.stderr)
    return 1
  return 1 if any(r["judged"] == 0 for r in results) else 0


if __name__ == "__main__":
  app.run(main)

"""One direction: `hlo_audit` stands alone; `pallas_kernels` plugs into it.

`hlo_audit` never imports `pallas_kernels` (it finds kernel libraries through
an entry point); `pallas_kernels` reads `hlo_audit` only from its `_src/audit/`
folder, and only its public names; scripts/ uses only public names of both.
Every module (and test) is parsed with `ast`, so imports inside functions,
`from pkg import _src` and `importlib.import_module("pkg...")` are caught as
well as top-level ones.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("hlo_audit", "pallas_kernels")

#: Tests of one package that still reach into the other's `_src`, for want of
#: a public equivalent (the CLI's `main`). Exact: a new one fails, and so does
#: a fixed one left listed.
KNOWN_TEST_EXCEPTIONS = frozenset({
    ("tests/pallas_kernels/swap/swap_cli_test.py", "hlo_audit._src.cli"),
})


def _other(package: str) -> str:
  (other,) = set(PACKAGES) - {package}
  return other


def imported_names(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
  """(line, dotted module name) of every import in `source`, at any depth."""
  for node in ast.walk(ast.parse(source, filename)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      yield node.lineno, node.module
      if "." not in node.module:  # `from pallas_kernels import _src`
        yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    elif (isinstance(node, ast.Call) and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
          and (getattr(node.func, "attr", None) == "import_module"
               or getattr(node.func, "id", None) in ("import_module", "__import__"))):
      yield node.lineno, node.args[0].value


def _private(name: str, package: str) -> bool:
  return name == f"{package}._src" or name.startswith(f"{package}._src.")


def _crossings(folder: pathlib.Path, package: str) -> Iterator[tuple[str, int, str, str]]:
  """(file, line, imported name, imported package) of each import of the
  other package from files under `folder`."""
  other = _other(package)
  for path in sorted(folder.rglob("*.py")):
    rel = path.relative_to(ROOT).as_posix()
    for line, name in imported_names(path.read_text(), rel):
      if name == other or name.startswith(other + "."):
        yield rel, line, name, other


#: The one folder of pallas_kernels that reads hlo_audit.
AUDIT_FOLDER = "pallas_kernels/_src/audit/"


def test_hlo_audit_never_imports_pallas_kernels():
  crossings = [f"{f}:{line}: imports {name}"
               for f, line, name, _ in _crossings(ROOT / "hlo_audit", "hlo_audit")]
  assert not crossings, "hlo_audit must find kernel libraries by entry point:\n" + \
      "\n".join(crossings)


def test_pallas_kernels_reads_hlo_audit_from_one_folder_by_public_names():
  crossings = list(_crossings(ROOT / "pallas_kernels", "pallas_kernels"))
  outside = [f"{f}:{line}: imports {name}" for f, line, name, _ in crossings
             if not f.startswith(AUDIT_FOLDER)]
  assert not outside, f"only {AUDIT_FOLDER} may import hlo_audit:\n" + "\n".join(outside)
  private = [f"{f}:{line}: imports {name}" for f, line, name, other in crossings
             if _private(name, other)]
  assert not private, ("pallas_kernels reaches into hlo_audit._src; use its public "
                       "API (add the name there if it is missing):\n" + "\n".join(private))
  # The scan saw the folder's real imports (it is not vacuous).
  assert {name for _, _, name, _ in crossings} >= {"hlo_audit", "hlo_audit.plugins"}


@pytest.mark.parametrize("package, other", [("hlo_audit", "pallas_kernels"),
                                            ("pallas_kernels", "hlo_audit")])
def test_importing_one_package_loads_none_of_the_other(package, other):
  code = (f"import sys, {package}; "
          f"print(sorted(m for m in sys.modules if m.split('.')[0] == {other!r}))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, cwd=ROOT)
  assert out.stdout.strip() == "[]"


def test_tests_use_only_the_other_packages_public_api():
  found = set()
  for package in PACKAGES:
    for f, line, name, other in _crossings(ROOT / "tests" / package, package):
      if _private(name, other):
        found.add((f, name, line))
  assert {(f, name) for f, name, _ in found} == KNOWN_TEST_EXCEPTIONS, sorted(found)


def test_scripts_use_only_public_names():
  """The benchmarks and device checks in scripts/ run the packages as users
  get them: no import of either package's `_src`, nor any other mention of it
  (a module run with `-m`, code in a string, a path): a script that needs an
  internal gets a public name for it, or was a diagnostic of internals."""
  found: dict[tuple[str, int], str] = {}
  scanned = 0
  for path in sorted((ROOT / "scripts").rglob("*")):
    if not path.is_file() or "__pycache__" in path.parts:
      continue
    scanned += 1
    rel = path.relative_to(ROOT).as_posix()
    text = path.read_text()
    for number, line in enumerate(text.splitlines(), 1):
      if "_src" in line:
        found[rel, number] = f"{rel}:{number}: names _src: {line.strip()}"
    if path.suffix == ".py":
      for number, name in imported_names(text, rel):
        if any(_private(name, package) for package in PACKAGES):
          found[rel, number] = f"{rel}:{number}: imports {name}"
  assert scanned >= 10, "the scan saw no scripts"
  assert not found, ("scripts/ reaches into a package's _src; use (or add) a public "
                     "name:\n" + "\n".join(found[k] for k in sorted(found)))


def test_parse_version_is_defined_once():
  defs = [path.relative_to(ROOT).as_posix()
          for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
          for node in ast.walk(ast.parse(path.read_text()))
          if isinstance(node, ast.FunctionDef) and node.name == "parse_version"]
  assert defs == ["hlo_audit/_src/compat.py"]


def test_the_scan_sees_lazy_and_indirect_imports():
  source = '''
import os
from hlo_audit import audit

def f():
  from pallas_kernels._src.swap import guard_check

class C:
  def g(self):
    import pallas_kernels._src.backend as b
    from pallas_kernels import _src
    importlib.import_module("pallas_kernels._src.registry")
'''
  private = sorted((line, name) for line, name in imported_names(source)
                   if _private(name, "pallas_kernels"))
  assert private == [(6, "pallas_kernels._src.swap"), (10, "pallas_kernels._src.backend"),
                     (11, "pallas_kernels._src"), (12, "pallas_kernels._src.registry")]


#: Import circles left on purpose: the report's convenience methods
#: (`AuditReport.to_json`, `.diff`) call renderers that read the report.
#: Exact: a new circle fails, and so does a broken one left listed.
KNOWN_CIRCLES = frozenset({
    frozenset({"hlo_audit._src.report.report", "hlo_audit._src.report.json_report",
               "hlo_audit._src.report.diff"}),
})


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
  """Module -> the modules of both packages it imports (at any depth)."""
  files = {}
  for package in PACKAGES:
    for path in (root / package).rglob("*.py"):
      name = ".".join(path.relative_to(root).with_suffix("").parts)
      files[name.removesuffix(".__init__")] = path
  graph = {}
  for name, path in files.items():
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        # `from pkg import mod` imports pkg.mod when that is a module.
        found = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                 else node.module for a in node.names]
      else:
        continue
      for imported in found:
        while imported and imported not in files:
          imported = imported.rpartition(".")[0]
        if imported and imported != name:
          targets.add(imported)
    graph[name] = targets
  return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
  """The import circles: strongly connected components of two or more."""
  index, low, on, stack, found = {}, {}, set(), [], set()

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = set()
      while True:
        w = stack.pop()
        on.discard(w)
        comp.add(w)
        if w == v:
          break
      if len(comp) > 1:
        found.add(frozenset(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_import_circles_but_the_known_ones():
  found = circles(import_graph(ROOT))
  assert found == KNOWN_CIRCLES, sorted(sorted(c) for c in found ^ KNOWN_CIRCLES)


def test_the_circle_finder_finds_circles():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
  assert circles(graph) == {frozenset("abc")}

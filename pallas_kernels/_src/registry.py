"""Every op's `OpSpec` by public name: the one place consumers find ops.

Each op folder under `ops/` has an `arg_specs.py` that exports `SPEC` (or
`SPECS`, a tuple, when the folder holds several ops); the folders are found by
listing the `ops` package's folder, so a new op is a new folder and nothing
else. Specs are imported on first use; a folder without `arg_specs.py` (one
still being built) is not an op yet. Any other import
error is kept in `load_errors()` (validation fails on it, and `get_spec` of a
missing name reports it): a broken op must not vanish from validation
silently, nor break every other op's.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

from pallas_kernels._src import ops as ops_package
from pallas_kernels._src.spec import Case, OpSpec


def _modules() -> tuple[str, ...]:
  """The op folders' `arg_specs` modules, in folder-name order (display order)."""
  folders = {entry for path in ops_package.__path__ for entry in os.listdir(path)
             if os.path.isfile(os.path.join(path, entry, "arg_specs.py"))}
  return tuple(f"{ops_package.__name__}.{name}.arg_specs" for name in sorted(folders))


_lock = threading.Lock()
_specs: dict[str, OpSpec] | None = None
_errors: dict[str, Exception] = {}


def _load() -> dict[str, OpSpec]:
  specs: dict[str, OpSpec] = {}
  for module_name in _modules():
    try:
      module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - reported through load_errors().
      _errors[module_name] = e
      continue
    found = getattr(module, "SPECS", None) or (getattr(module, "SPEC", None),)
    for spec in found:
      if not isinstance(spec, OpSpec):
        raise TypeError(f"{module_name} exports {spec!r}, not an OpSpec")
      if spec.name in specs:
        raise ValueError(f"op {spec.name!r} registered twice ({module_name})")
      specs[spec.name] = spec
  return specs


def specs() -> Mapping[str, OpSpec]:
  """Read-only name -> OpSpec of every available op."""
  global _specs
  with _lock:
    if _specs is None:
      _specs = _load()
    return MappingProxyType(_specs)


def load_errors() -> Mapping[str, Exception]:
  """arg_specs modules that exist but failed to import, with their errors."""
  specs()
  return MappingProxyType(_errors)


def spec_names() -> tuple[str, ...]:
  """Names of the registered ops, in display order."""
  return tuple(specs())


def get_spec(name: str | OpSpec) -> OpSpec:
  """The OpSpec of op `name` (an OpSpec passes through).

  Raises:
    KeyError: if no op of that name is registered; the message lists them.
  """
  if isinstance(name, OpSpec):
    return name
  table = specs()
  if name not in table:
    broken = "".join(f"; {m} failed to import: {e!r}" for m, e in _errors.items())
    raise KeyError(f"unknown op {name!r}; registered: {', '.join(table)}{broken}")
  return table[name]


class NoCasesError(ValueError):
  """A selection of ops, tags and dtypes that holds no case: a vacuous pass
  (or benchmark) would hide a typo in the tags or dtypes."""


def select_cases(op, tags: Sequence[str],
                 seed: int) -> Iterator[tuple[OpSpec, Case]]:
  """The cases of `op` (a name, an OpSpec, or a sequence of them) that carry
  any of `tags`, each once, in op then tag order: what `validate` and `bench`
  run."""
  ops = [op] if isinstance(op, (str, OpSpec)) else list(op)
  for item in ops:
    spec = get_spec(item)
    seen: set[str] = set()
    for tag in tags:
      for case in spec.cases(tag, seed):
        if case.name not in seen:
          seen.add(case.name)
          yield spec, case


class _LazySpecs(Mapping):
  """`SPECS`: a mapping that loads the registry on first access."""

  def __getitem__(self, name: str) -> OpSpec:
    return specs()[name]

  def __iter__(self):
    return iter(specs())

  def __len__(self) -> int:
    return len(specs())

  def __repr__(self) -> str:
    return f"SPECS({', '.join(specs())})"


#: name -> OpSpec, loaded lazily (importing this module imports no op).
SPECS: Mapping[str, OpSpec] = _LazySpecs()

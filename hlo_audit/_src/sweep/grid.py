"""Sweep grids: parsing, the cartesian product, sharding and stable point ids.

Grid syntax on the command line (`--grid`):

    name=v1,v2;name2=v3,v4

is the cartesian product of the named value lists, the last name varying
fastest. A value is an integer (`128`), a float (`0.5`), `true`/`false`,
`none`, or otherwise a string (`bfloat16`, `gelu`). Blanks around names and
values are ignored; a name given twice is an error.

A grid file (`--grid-file`) is JSON (`.json`) or TOML (`.toml`) holding a
`grid` table of lists (the cartesian product, as above) and/or `points`, a list
of tables, each one extra point (for combinations a product cannot express,
such as d_model and heads that must divide). Each `grid` entry is a list, one
value too (`seq = [16]`): a bare value is refused rather than taken as a
one-value list, since `b = "1,2,4"` (the `--grid` spelling) would otherwise
be one string value and fail far from the file. In TOML:

    [grid]
    batch = [1, 2, 4]
    dtype = ["float32", "bfloat16"]

    [[points]]
    d_model = 96
    heads = 3

`--grid` given with `--grid-file` replaces the file's lists of the same names.
A file with neither `grid` nor `points` is read as a bare `grid` table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Union

from hlo_audit._src.errors import HloAuditError

#: A grid value: what a grid file or `--grid` can spell.
Value = Union[int, float, bool, str, None]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class GridError(HloAuditError, ValueError):
  """A grid, grid file or argument template that cannot be used."""


@dataclasses.dataclass(frozen=True, slots=True)
class Axis:
  """One named list of values of a grid."""

  name: str
  values: tuple[Value, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Grid:
  """Named value lists (their cartesian product) plus explicit extra points."""

  axes: tuple[Axis, ...] = ()
  #: Extra points, each a name -> value mapping, after the product's points.
  extra: tuple[Mapping[str, Value], ...] = ()

  @property
  def names(self) -> tuple[str, ...]:
    """Every name the grid sets, axes first, in order of appearance."""
    seen = [a.name for a in self.axes]
    for p in self.extra:
      seen += [n for n in p if n not in seen]
    return tuple(seen)

  @property
  def size(self) -> int:
    """How many points `points()` gives, counted without making them (the
    product of the axes' lengths, plus the extra points)."""
    if not self.axes and not self.extra:
      return 1
    product = 0
    if self.axes:
      product = 1
      for a in self.axes:
        product *= len(a.values)
    return product + len(self.extra)

  def points(self) -> tuple[dict[str, Value], ...]:
    """The product's points (the last axis varying fastest), then the extra
    points; an empty grid is one point with every default."""
    if not self.axes and not self.extra:
      return ({},)
    out: list[dict[str, Value]] = []
    if self.axes:
      names = [a.name for a in self.axes]
      out += [dict(zip(names, combo))
              for combo in itertools.product(*(a.values for a in self.axes))]
    out += [dict(p) for p in self.extra]
    return tuple(out)

  def replace_axes(self, other: Grid) -> Grid:
    """This grid with `other`'s axes replacing (or added to) its own."""
    theirs = {a.name: a for a in other.axes}
    axes = [theirs.pop(a.name, a) for a in self.axes] + list(theirs.values())
    return Grid(axes=tuple(axes), extra=self.extra + other.extra)


def parse_value(text: str) -> Value:
  """'128' -> 128, '0.5' -> 0.5, 'true' -> True, 'none' -> None, else the text."""
  t = text.strip()
  low = t.lower()
  if low in ("true", "false"):
    return low == "true"
  if low in ("none", "null"):
    return None
  try:
    return int(t)
  except ValueError:
    pass
  try:
    return float(t)
  except ValueError:
    return t


def parse_grid(text: str) -> Grid:
  """Parses `name=v1,v2;name2=v3` (see the module docstring).

  Raises:
    GridError: for a part without `=`, a bad name, an empty value list, or a
      name given twice.
  """
  axes: list[Axis] = []
  for part in text.split(";"):
    if not part.strip():
      continue
    name, sep, values = part.partition("=")
    name = name.strip()
    if not sep:
      raise GridError(f"--grid part {part.strip()!r}: expected NAME=V1,V2,...")
    _check_name(name, f"--grid part {part.strip()!r}")
    items = [v for v in values.split(",") if v.strip()]
    if not items:
      raise GridError(f"--grid part {part.strip()!r}: no values for {name!r}")
    if any(a.name == name for a in axes):
      raise GridError(f"--grid names {name!r} twice")
    axes.append(Axis(name, tuple(parse_value(v) for v in items)))
  return Grid(axes=tuple(axes))


def load_grid_file(path: str | os.PathLike) -> Grid:
  """Reads a JSON or TOML grid file (see the module docstring).

  Raises:
    GridError: for an unreadable or malformed file, or values that are not
      scalars.
  """
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise GridError(f"--grid-file {path!r}: {e.strerror}") from None
  try:
    if path.endswith(".toml"):
      data = tomllib.loads(raw.decode("utf-8"))
    elif path.endswith(".json"):
      data = json.loads(raw)
    else:
      raise GridError(f"--grid-file {path!r}: expected a .json or .toml file")
  except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise GridError(f"--grid-file {path!r}: {e}") from None
  except RecursionError:
    raise GridError(f"--grid-file {path!r}: nested too deeply to be a grid") from None
  if not isinstance(data, dict):
    raise GridError(f"--grid-file {path!r}: expected a table at the top level")
  if "grid" not in data and "points" not in data:
    data = {"grid": data}
  unknown = set(data) - {"grid", "points"}
  if unknown:
    raise GridError(f"--grid-file {path!r}: unknown top-level keys "
                    f"{sorted(unknown)} (expected 'grid' and/or 'points')")
  grid_table = data.get("grid", {})
  if not isinstance(grid_table, dict):
    raise GridError(f"--grid-file {path!r}: 'grid' must be a table of lists")
  axes = []
  for name, values in grid_table.items():
    where = f"--grid-file {path!r}, grid.{name}"
    _check_name(name, where)
    if not isinstance(values, list):
      one = (f'"{name}": [{_literal(values)}]' if path.endswith(".json") else
             f"{name} = [{_literal(values)}]")
      raise GridError(f"{where}: expected a list of values, got {_kind(values)} "
                      f"{values!r} (one value is a one-item list: {one})")
    if not values:
      raise GridError(f"{where}: no values")
    axes.append(Axis(name, tuple(_scalar(v, where) for v in values)))
  points = data.get("points", [])
  if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
    raise GridError(f"--grid-file {path!r}: 'points' must be a list of tables")
  extra = []
  for i, p in enumerate(points):
    where = f"--grid-file {path!r}, points[{i}]"
    for name in p:
      _check_name(name, where)
    extra.append({n: _scalar(v, f"{where}.{n}") for n, v in p.items()})
  return Grid(axes=tuple(axes), extra=tuple(extra))


def shard(items: Sequence, num_shards: int, index: int) -> list:
  """Items `index`, `index + num_shards`, ...: round-robin, so shards of a
  grid differ in size by at most one point.

  Raises:
    GridError: unless 0 <= index < num_shards.
  """
  if not 0 <= index < num_shards:  # (no index passes for num_shards < 1)
    raise GridError(f"need 0 <= shard_index < num_shards, got shard_index={index}, "
                    f"num_shards={num_shards}")
  return list(items[index::num_shards])


def point_id(identity: Mapping) -> str:
  """A stable 12-hex-digit id of what a point computes (its canonical JSON)."""
  text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_name(name: str, where: str) -> None:
  if not _NAME.match(name):
    raise GridError(f"{where}: {name!r} is not a name (letters, digits, _)")


def _kind(v) -> str:
  if isinstance(v, bool):
    return "the boolean"
  if isinstance(v, (int, float)):
    return "the number"
  if isinstance(v, str):
    return "the string"
  return "a table" if isinstance(v, dict) else f"a {type(v).__name__}"


def _literal(v) -> str:
  """`v` as a list item in JSON and TOML alike."""
  return json.dumps(v) if isinstance(v, (bool, int, float, str)) else "..."


def _scalar(v, where: str) -> Value:
  if v is None or isinstance(v, (bool, int, float)):
    return v
  if isinstance(v, str):
    return parse_value(v) if v.strip().lower() in ("none", "null") else v
  raise GridError(f"{where}: {v!r} is not a number, boolean or string")

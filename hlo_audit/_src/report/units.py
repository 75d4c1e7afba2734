"""Number formatting shared by every renderer (bytes, counts, percentages)."""

from __future__ import annotations

import functools
import os
import re

from hlo_audit._src.analysis import source
from hlo_audit._src.hlo.ir import SourceLocation


def fmt_bytes(n: int | float | None) -> str:
  """1536 -> "1.50 KiB"; None -> "n/a"."""
  if n is None:
    return "n/a"
  n = float(n)
  sign = "-" if n < 0 else ""
  n = abs(n)
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{sign}{int(n)} B" if unit == "B" else f"{sign}{n:.2f} {unit}"
    n /= 1024
  return f"{sign}{n:.2f} TiB"  # pragma: no cover


def short_kernel(name: str | None) -> str:
  """A library op without its library: "pallas_kernels.matmul" -> "matmul";
  None -> "-"."""
  return name.split(".", 1)[-1] if name else "-"


def fmt_delta_bytes(n: int) -> str:
  """A change in bytes, signed: 1536 -> "+1.50 KiB", -1536 -> "-1.50 KiB", 0 -> "0 B"."""
  return ("+" if n > 0 else "") + fmt_bytes(n)


def fmt_pct(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:+.2f}%"


def fmt_source(loc: SourceLocation | None) -> str:
  """"path:line" as the user would open it: relative to the current folder
  when the file is below it, else from the root of its Python package
  (`hlo_audit/_src/examples/transformer.py:93`), else as recorded."""
  if loc is None:
    return ""
  return f"{openable_path(loc.file, os.getcwd())}:{loc.line}"


@functools.lru_cache(maxsize=4096)
def openable_path(path: str, cwd: str) -> str:
  """`path` relative to `cwd` when below it, else from its package root."""
  if not path or not os.path.isabs(path):
    return path
  norm = os.path.normpath(path)
  if norm.startswith(os.path.join(cwd, "")):
    return os.path.relpath(norm, cwd)
  # Walk up while the folder is a package: the top package's parent is the
  # folder on sys.path, and the rest is the path as imports name it.
  root = os.path.dirname(norm)
  while os.path.isfile(os.path.join(root, "__init__.py")):
    root = os.path.dirname(root)
  if root != os.path.dirname(norm):
    return os.path.relpath(norm, root)
  return norm


def fmt_source_context(loc: SourceLocation | None,
                       stack: tuple[SourceLocation, ...] = ()) -> str:
  """"model.py:27 (in flax Linear.__call__ at nn/linear.py:422)": the
  user's line, and the library frame it called into when there is one."""
  where = fmt_source(loc)
  ctx = source.context(loc, stack)
  return f"{where} ({ctx})" if where and ctx else where


def fmt_trip(trip: int | None) -> str:
  return "?" if trip is None else str(trip)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2,
               "mb": 1000 ** 2, "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
               "gib": 1024 ** 3, "tb": 1000 ** 4, "tib": 1024 ** 4}


def parse_bytes(text: str | int) -> int:
  """"1MiB", "512 KiB", "1.5GB", "4096" -> bytes (IEC units are powers of
  1024, SI units of 1000).

  Raises:
    ValueError: naming the accepted forms.
  """
  if isinstance(text, int):
    return text
  m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
  unit = m.group(2).lower() if m else None
  if m is None or unit not in _SIZE_UNITS:
    raise ValueError(f"{text!r} is not a size: expected e.g. 4096, 512KiB, 1MiB, 2GB")
  return int(float(m.group(1)) * _SIZE_UNITS[unit])

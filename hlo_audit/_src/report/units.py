"""Number formatting shared by every renderer (bytes, counts, percentages)."""

from __future__ import annotations

import functools
import math
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
  """A library op by its own name: "pallas_kernels.matmul" -> "matmul",
  "jax.nn.dot_product_attention" -> "dot_product_attention"; None -> "-"."""
  return name.rsplit(".", 1)[-1] if name else "-"


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


#: Time units, largest first: (unit, seconds).
_TIME_STEPS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))

#: Units `parse_time` reads: (unit, per second); divided by, so "5us" is
#: exactly the float 5e-6.
_PER_SECOND = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6,
               "ns": 1e9}


def fmt_time(seconds: float | None) -> str:
  """Three significant figures in the largest unit that keeps them at 1 or
  more: 1.23e-5 -> "12.3 us", 1.25e-3 -> "1.25 ms", 2 -> "2.00 s",
  8.5e-7 -> "850 ns"; negative with a sign (a change that costs time);
  None -> "n/a"."""
  if seconds is None:
    return "n/a"
  if seconds == 0 or not math.isfinite(seconds):
    return f"{seconds:g} s"
  sign = "-" if seconds < 0 else ""
  x = abs(seconds)
  for unit, scale in _TIME_STEPS:
    v = x / scale
    digits = 0 if v >= 99.95 else 1 if v >= 9.995 else 2
    # Rounded first, so 999.96 us reads "1.00 ms", not "1000 us".
    if round(v, digits) >= 1 or unit == "ns":
      return f"{sign}{v:.{digits}f} {unit}"
  raise AssertionError("unreachable")  # pragma: no cover


def parse_time(text: str | float | int) -> float:
  """"5us", "1.5ms", "2s", "850 ns", 2e-6 -> seconds (a bare number is
  seconds; "\u00b5s" is "us").

  Raises:
    ValueError: naming the text and the accepted forms (for a negative,
      infinite or NaN time too).
  """
  bad = ValueError(f"{text!r} is not a time: expected seconds as a number, or a "
                   "number and a unit (ns, us, ms, s), e.g. 850ns, 5us, 1.5ms, 2s")
  if isinstance(text, bool):
    raise bad
  if isinstance(text, (int, float)):
    value = float(text)
  else:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)\s*"
                     r"([A-Za-z\u00b5\u03bc]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if unit not in _PER_SECOND:  # (None, no match, is no unit either)
      raise bad
    value = float(m.group(1)) / _PER_SECOND[unit]
  if not math.isfinite(value) or value < 0:
    raise bad
  return value

"""Number formatting shared by every renderer (bytes, counts, percentages)."""

from __future__ import annotations

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


def fmt_delta_bytes(n: int) -> str:
  return ("+" if n > 0 else "") + fmt_bytes(n)


def fmt_pct(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:+.2f}%"


def fmt_source(loc: SourceLocation | None) -> str:
  """"file.py:42" (the file's basename kept with its last folder)."""
  if loc is None:
    return ""
  parts = loc.file.replace("\\", "/").split("/")
  short = "/".join(parts[-2:]) if len(parts) > 1 else loc.file
  return f"{short}:{loc.line}"


def fmt_source_context(loc: SourceLocation | None,
                       stack: tuple[SourceLocation, ...] = ()) -> str:
  """"model.py:27 (in flax Linear.__call__ at nn/linear.py:422)": the
  user's line, and the library frame it called into when there is one."""
  where = fmt_source(loc)
  ctx = source.context(loc, stack)
  return f"{where} ({ctx})" if where and ctx else where


def fmt_trip(trip: int | None) -> str:
  return "?" if trip is None else str(trip)

"""Plain-text layout shared by the terminal report, `str(report)` and the
testing assertions: the width rule, shortening names, and tables that fit a
width without breaking a name or a `file:line` in the middle.

Names (instructions, kernels, shapes) give up width last: prose wraps at
spaces first, a table's source column moves to a line of its own under the
row, and only then does a name column narrow. At 80 columns and wider a name
is never cut (one too long for its column gets a line of its own above its
row); narrower, it is shortened with an ellipsis in the middle (its start and
numbered suffix stay readable). Numbers and `file:line` are never broken.

Names, paths and metadata are the input's text: a table's cells and the
sentences `hang` wraps are made `safe.printable` before their widths are
measured, so a control character shows as its escape and columns stay aligned.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

from hlo_audit._src.report.safe import printable

#: Text width when the output is not a terminal and COLUMNS is unset.
PIPED_WIDTH = 160
#: Narrowest width the layout aims at.
MIN_WIDTH = 40
ELLIPSIS = "…"
#: From this width up, names (instructions, kernels, shapes) are never cut.
WHOLE_NAMES = 80


def text_width(stream=None, width: int | None = None) -> int:
  """The width rule of the CLI and `print(report)`: an explicit width, else
  $COLUMNS, else the terminal's width when `stream` is one, else PIPED_WIDTH."""
  if width:
    return max(MIN_WIDTH, width)
  env = os.environ.get("COLUMNS", "")
  if env.isdigit() and int(env) > 0:
    return max(MIN_WIDTH, int(env))
  stream = sys.stdout if stream is None else stream
  try:
    if stream.isatty():
      return max(MIN_WIDTH, shutil.get_terminal_size((PIPED_WIDTH, 24)).columns)
  except (AttributeError, ValueError, OSError):
    pass
  return PIPED_WIDTH


def elide(s: str, n: int) -> str:
  """`s` in at most `n` characters, shortened in the middle."""
  if len(s) <= n:
    return s
  if n <= 1:
    return ELLIPSIS[:n]
  head = n // 2
  tail = n - 1 - head
  return s[:head] + ELLIPSIS + (s[-tail:] if tail else "")


def wrap(s: str, n: int, *, indent: str = "") -> list[str]:
  """Words of `s` in lines of at most `n` characters (after the first line,
  each starts with `indent`); a word longer than a line is elided, never split."""
  return hang(s, n, "", indent)


def hang(s: str, width: int, first: str = "", rest: str = "") -> list[str]:
  """`s` wrapped at spaces to `width`: the first line starts with `first`,
  the others with `rest` (a hanging indent)."""
  out: list[str] = []
  cur, empty = first, True
  # Escaped before the split: a CR or a line separator is shown, not
  # taken for a space.
  for word in printable(s).split():
    if not empty and len(cur) + 1 + len(word) <= width:
      cur += " " + word
      continue
    if not empty:
      out.append(cur)
      cur = rest
    cur += elide(word, max(1, width - len(cur)))
    empty = False
  out.append(cur)
  return out


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
  """A table column and how it may give up width."""

  header: str
  #: "num" (right-aligned, never broken), "name" (elided in the middle),
  #: "text" (wrapped at spaces), "source" (`file:line`, never broken; moves
  #: under the row when the table is too wide).
  kind: str = "text"
  #: Dropped first when the table is too wide.
  optional: bool = False
  #: Narrowest a name or text column gets.
  min_width: int = 8
  #: Among optional columns, the higher goes first (then left to right).
  drop_first: int = 0


def _cell_lines(col: Column, cell: str, w: int, whole: bool) -> list[str]:
  if col.kind == "name":
    # A whole name too long for its column is printed on a line above the
    # row (`table`); the row's cell is left blank.
    return [""] if whole else [elide(cell, w)]
  if col.kind == "text":
    return wrap(cell, w) if len(cell) > w else [cell]
  return [cell]


def table(columns, rows, width: int, *, indent: int = 2,
          title: str | None = None) -> list[str]:
  """`rows` (sequences of cells) under `columns` in lines of at most `width`
  characters where the cells allow it (numbers and `file:line` are never
  broken, so a very narrow width can still be exceeded).

  At `WHOLE_NAMES` columns and wider a name is never cut: a name longer than
  its column gets a line of its own above its row, starting where its column
  starts; narrower, it is shortened in the middle."""
  columns = [dataclasses.replace(c, header=printable(c.header)) for c in columns]
  rows = [[printable(c) for c in r] for r in rows]
  keep = list(range(len(columns)))
  src_below = None
  gap = 2
  whole = width >= WHOLE_NAMES

  def natural(i):
    return max([len(columns[i].header)] + [len(r[i]) for r in rows])

  def total(ws):
    return indent + sum(ws.values()) + gap * (len(ws) - 1)

  def longest_word(i):
    # At whole-name widths text wraps at spaces but no word of it is cut.
    if not whole or columns[i].kind != "text":
      return 0
    return max([len(w) for r in rows for w in r[i].split()] or [0])

  floors = {i: longest_word(i) for i in keep}
  ws = {i: natural(i) for i in keep}
  # Names give up width last: every other way to fit is tried first.
  for step in ("optional", "wrap", "source", "gap", "wrap hard", "names"):
    if total(ws) <= width:
      break
    if step == "optional":
      for i in sorted((i for i in keep if columns[i].optional),
                      key=lambda i: -columns[i].drop_first):
        if total(ws) <= width:
          break
        keep.remove(i)
        del ws[i]
    elif step == "source":
      src = [i for i in keep if columns[i].kind == "source"]
      if src:
        src_below = src[0]
        keep.remove(src_below)
        del ws[src_below]
        ws = {i: natural(i) for i in keep}
        _shrink(columns, ws, width - total(ws), ("text",), floors, soft=True)
    elif step == "gap":
      gap = 1
    elif step == "names":
      _shrink(columns, ws, width - total(ws), ("name",), floors, soft=False)
    else:
      _shrink(columns, ws, width - total(ws), ("text",), floors,
              soft=step == "wrap")
  out = []
  if title:
    out += wrap(title, width, indent="  ")
  header = " " * indent + (" " * gap).join(
      _pad(columns[i], elide(columns[i].header, ws[i]), ws[i]) for i in keep)
  out.append(header.rstrip())
  lead, sep = " " * indent, " " * gap
  # Per kept column: (pad, width, wraps): most cells are one line.
  fmt = [(str.rjust if columns[i].kind == "num" else str.ljust, ws[i],
          columns[i].kind in ("name", "text")) for i in keep]
  starts, at = [], indent
  for _, w, _ in fmt:
    starts.append(at)
    at += w + gap
  for r in rows:
    if whole:
      for (_, w, _), i, start in zip(fmt, keep, starts):
        if columns[i].kind == "name" and len(r[i]) > w:
          out.append(" " * start + r[i])
    cells = [_cell_lines(columns[i], r[i], w, whole) if wraps and len(r[i]) > w else r[i]
             for i, (_, w, wraps) in zip(keep, fmt)]
    if all(c.__class__ is str for c in cells):
      out.append((lead + sep.join(pad(c, w) for (pad, w, _), c in zip(fmt, cells))).rstrip())
    else:
      cells = [[c] if c.__class__ is str else c for c in cells]
      for j in range(max(len(c) for c in cells)):
        line = lead + sep.join(pad(c[j] if j < len(c) else "", w)
                               for (pad, w, _), c in zip(fmt, cells))
        out.append(line.rstrip())
    if src_below is not None and r[src_below]:
      out.append(" " * (indent + 4) + r[src_below])
  return out


def _pad(col: Column, s: str, w: int) -> str:
  return s.rjust(w) if col.kind == "num" else s.ljust(w)


def _shrink(columns, ws, excess: int, kinds: tuple[str, ...], floors: dict[int, int], *,
            soft: bool) -> None:
  """Takes -excess characters from the widest columns of `kinds` (text wraps
  and loses nothing; a name is elided or set above its row), down to their
  minimum (soft: twice their minimum; never under `floors`)."""
  need = -excess
  while need > 0:
    room = [(ws[i] - max(_floor(columns[i], soft), floors[i]), i)
            for i in ws if columns[i].kind in kinds]
    room = [(r, i) for r, i in room if r > 0]
    if not room:
      break
    _, i = max(room)
    ws[i] -= 1
    need -= 1


def _floor(col: Column, soft: bool) -> int:
  # Headers stay whole: they say what the column is.
  return max(col.min_width * (2 if soft else 1), len(col.header))


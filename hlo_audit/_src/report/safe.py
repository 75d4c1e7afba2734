"""Text from the input, made safe to print: the one sanitiser for terminal
and Markdown output.

An HLO module's names and metadata (`op_name`, `source_file`), a file's
path and a parse error's excerpt are somebody else's bytes. Written raw, an
ESC or BEL in a dump clears the screen, recolours or overwrites rows, or plants
an OSC 8 hyperlink; a CR rewrites the line it sits on; Unicode's bidirectional
overrides reorder what the reader sees; a lone surrogate (a non-UTF-8 byte read
with `surrogateescape`) makes `print` raise. `printable` shows each of those as
the escape Python would write for it, so the text is still legible and
nothing acts on the terminal. `markdown_text` also escapes what CommonMark
would read as markup (HTML, links, emphasis, table pipes). The HTML page
escapes on its own (`html.escape`); JSON escapes by encoding.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (Unicode category Cc); the line and
# paragraph separators; the bidirectional embeddings, overrides and isolates
# ("Trojan Source", CVE-2021-42574); lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")

# ASCII punctuation CommonMark gives a meaning inline (emphasis, code spans,
# links and images, raw HTML and entities, GFM strikethrough and table
# pipes, backslash itself); any ASCII punctuation may be backslash-escaped.
# A `_` between two letters or digits (`d_model`) can neither open nor close
# emphasis, so it stays bare and the raw Markdown stays readable.
_MARKDOWN = re.compile(r"[\\`*\[\]<>|!&~#]|(?<![^\W_])_|_(?![^\W_])")


def _escape(m: re.Match) -> str:
  c = m.group(0)
  o = ord(c)
  if 0xDC80 <= o <= 0xDCFF:  # a byte `surrogateescape` kept: show that byte
    return f"\\x{o - 0xDC00:02x}"
  if o <= 0xFF:
    return f"\\x{o:02x}"
  return f"\\u{o:04x}"


def printable(text: object) -> str:
  """`text` with every control character, bidirectional override and lone
  surrogate shown as its escape (`\\x1b`, `\\u202e`); other text unchanged.

  A newline is escaped too: call it per line where lines are meant.
  """
  s = str(text)
  return _UNSAFE.sub(_escape, s) if _UNSAFE.search(s) else s


def printable_lines(text: object) -> str:
  """`printable` for text whose newlines are meant (a multi-line message)."""
  return "\n".join(printable(line) for line in str(text).split("\n"))


def markdown_text(text: object) -> str:
  """`text` as inline Markdown that renders as the same characters: control
  characters escaped (`printable`), CommonMark's markup characters
  backslash-escaped, a newline as a space."""
  s = printable(str(text).replace("\n", " "))
  return _MARKDOWN.sub(r"\\\g<0>", s)


def code_span(text: object) -> str:
  """`text` (made `printable`) as an inline code span: its backtick string
  is longer than any run inside, and a space pads a text that starts or
  ends with a backtick or a space, so nothing in it closes the span early
  and it shows as written. Not for table cells (GFM splits them at `|`
  even inside a span): use `markdown_text` there."""
  s = printable(text)
  if not s:
    return ""
  longest = max((len(r) for r in re.findall("`+", s)), default=0)
  ticks = "`" * (longest + 1)
  pad = " " if s[0] in "` " or s[-1] in "` " else ""
  return f"{ticks}{pad}{s}{pad}{ticks}"


def code_fence(text: str) -> str:
  """`text` (already `printable` per line) in a fenced code block whose fence
  is longer than any run of backticks inside it, so nothing closes it early."""
  longest = max((len(r) for r in re.findall("`+", text)), default=0)
  fence = "`" * max(3, longest + 1)
  return f"{fence}\n{text}\n{fence}"

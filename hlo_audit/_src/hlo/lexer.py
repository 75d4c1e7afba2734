"""HLO text lexer: tokens with kinds and offsets, as XLA's `HloLexer` makes them.

The lexer tracks offsets only; line and column are computed when an error is
raised (`error_at`). The parser's fast path reads whole instruction lines with
regular expressions and never calls the lexer, so the lexer only has to be
correct, not fast: it runs on unusual statements, headers and attribute values.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple, NoReturn

from hlo_audit._src.errors import HloParseError
from hlo_audit._src.hlo import dtypes


class Tok(enum.Enum):
  """Token kinds, after `xla/hlo/parser/hlo_lexer.h`."""

  EOF = "end of input"
  EQUAL = "'='"
  COMMA = "','"
  COLON = "':'"
  ASTERISK = "'*'"
  OCTOTHORP = "'#'"
  PLUS = "'+'"
  TILDE = "'~'"
  LSQUARE = "'['"
  RSQUARE = "']'"
  LBRACE = "'{'"
  RBRACE = "'}'"
  LPAREN = "'('"
  RPAREN = "')'"
  ARROW = "'->'"
  LEQ = "'<='"
  DOTS = "'...'"
  QUESTION = "'?'"
  #: `%name`, or `name:` (the colon is part of the token, as in XLA).
  NAME = "name"
  #: `name=` (the `=` is part of the token).
  ATTRIBUTE_NAME = "attribute name"
  IDENT = "identifier"
  KEYWORD = "keyword"
  PRIMITIVE_TYPE = "element type"
  INT = "integer"
  DECIMAL = "decimal"
  STRING = "string"
  DIM_LABELS = "dim labels"
  DXD = "NxM pattern"
  PAD = "padding pattern"
  NEG_INF = "'-inf'"


class Token(NamedTuple):
  """One token: kind, [start, end) offsets in the text, and its value.

  The value is the name for NAME/ATTRIBUTE_NAME (without `%`, `:` or `=`),
  the decoded string for STRING, int/float for INT/DECIMAL, and the text
  otherwise.
  """

  kind: Tok
  start: int
  end: int
  value: object


KEYWORDS = frozenset({
    "true", "false", "inf", "HloModule", "ENTRY", "ROOT", "FileLocations",
    "FileNames", "FunctionNames", "StackFrames", "maximal", "replicated",
    "manual", "last_tile_dim_replicate", "shard_as", "shard_like", "unknown",
    "unreduced",
})

_SKIP = re.compile(r"(?:[ \t\n\r]+|//[^\n\r]*|/\*.*?\*/)*", re.DOTALL)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_PERCENT_NAME = re.compile(r"%([A-Za-z_][A-Za-z0-9_.\-]*)")
_DIM_LABELS = re.compile(r"[0-9bf?]{2,}_[0-9io?]{2,}->[0-9bf?]{2,}")
_FLOAT = re.compile(
    r"-?(?:(?:\d+|\d+\.\d*|\d*\.\d+)[eE][+-]?\d+|\d+\.\d*|\d*\.\d+)")
_DXD = re.compile(r"[0-9]+(?:x[0-9]+)+")
_PAD = re.compile(r"-?[0-9]+_-?[0-9]+(?:_[0-9]+)?(?:x-?[0-9]+_-?[0-9]+(?:_[0-9]+)?)*")
_INT = re.compile(r"-?\d+")
_NAN_PAYLOAD = re.compile(r"\(0x[0-9a-fA-F]+\)")
_STRING = {
    '"': re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL),
    "'": re.compile(r"'((?:[^'\\]|\\.)*)'", re.DOTALL),
}
_PUNCT = {
    "=": Tok.EQUAL, ",": Tok.COMMA, ":": Tok.COLON, "*": Tok.ASTERISK,
    "#": Tok.OCTOTHORP, "+": Tok.PLUS, "~": Tok.TILDE, "[": Tok.LSQUARE,
    "]": Tok.RSQUARE, "{": Tok.LBRACE, "}": Tok.RBRACE, "(": Tok.LPAREN,
    ")": Tok.RPAREN,
}
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'",
            "?": "?", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
_ESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)", re.DOTALL)


def unescape(body: str) -> str:
  """Decodes C escapes in a string literal body (as absl::CUnescape does)."""
  if "\\" not in body:
    return body

  def one(m: re.Match) -> str:
    e = m.group(1)
    if e[0] == "x":
      return chr(int(e[1:], 16))
    if e[0] in "01234567":
      return chr(int(e, 8))
    return _ESCAPES.get(e, e)

  return _ESCAPE_RE.sub(one, body)


def line_col(text: str, offset: int) -> tuple[int, int, str]:
  """1-based (line, column) of `offset` and the text of its line.

  Lines break at '\\n', as XLA counts them; a '\\r' before it is dropped.
  """
  offset = max(0, min(offset, len(text)))
  line = text.count("\n", 0, offset) + 1
  start = text.rfind("\n", 0, offset) + 1
  end = text.find("\n", offset)
  if end < 0:
    end = len(text)
  return line, offset - start + 1, text[start:end].rstrip("\r")


def error_at(text: str, offset: int, message: str,
             source: str | None = None) -> NoReturn:
  """Raises `HloParseError` for `message` at `offset` of `text`."""
  line, col, line_text = line_col(text, offset)
  raise HloParseError(message, line=line, column=col, line_text=line_text,
                      source=source)


class Lexer:
  """Tokens of `text` from an offset onward, one at a time.

  `tok` is the current token; `lex()` moves to the next one. `save()` and
  `restore()` let the parser backtrack (XLA's parser does the same to tell a
  named operand from a nested instruction).
  """

  __slots__ = ("text", "source", "tok", "prev_end", "_pos", "_n")

  def __init__(self, text: str, pos: int = 0, source: str | None = None):
    self.text = text
    self.source = source
    self._pos = pos
    self._n = len(text)
    #: End offset of the last token consumed by `lex()`.
    self.prev_end = pos
    self.tok = self._next()

  def error(self, message: str, offset: int | None = None) -> NoReturn:
    """Raises `HloParseError` at `offset` (default: the current token)."""
    error_at(self.text, self.tok.start if offset is None else offset, message,
             self.source)

  def lex(self) -> Token:
    """Advances to the next token and returns it."""
    self.prev_end = self.tok.end
    self.tok = self._next()
    return self.tok

  def seek(self, pos: int) -> Token:
    """Restarts lexing at `pos`, as if a token ending there was consumed."""
    self._pos = pos
    self.prev_end = pos
    self.tok = self._next()
    return self.tok

  def save(self) -> tuple[Token, int, int]:
    return self.tok, self._pos, self.prev_end

  def restore(self, state: tuple[Token, int, int]) -> None:
    self.tok, self._pos, self.prev_end = state

  def peek(self) -> Token:
    """The token after the current one, without moving."""
    tok, pos = self.tok, self._pos
    nxt = self._next()
    self.tok, self._pos = tok, pos
    return nxt

  @property
  def pos(self) -> int:
    """Offset just past the current token."""
    return self._pos

  def _next(self) -> Token:
    text = self.text
    pos = _SKIP.match(text, self._pos).end()
    if pos >= self._n:
      self._pos = pos
      return Token(Tok.EOF, pos, pos, None)
    c = text[pos]
    if c == "/" and text.startswith("/*", pos):
      self.error("unterminated /* comment", pos)
    tok = self._lex_at(pos, c)
    self._pos = tok.end
    return tok

  def _lex_at(self, pos: int, c: str) -> Token:
    text = self.text
    if c.isascii() and (c.isalpha() or c == "_"):
      return self._lex_identifier(pos)
    if c in "0123456789-?":
      if c == "-" and text.startswith("->", pos):
        return Token(Tok.ARROW, pos, pos + 2, "->")
      tok = self._lex_number_or_pattern(pos)
      if tok is not None:
        return tok
      if c == "?":
        return Token(Tok.QUESTION, pos, pos + 1, "?")
      self.error("invalid number or pattern", pos)
    kind = _PUNCT.get(c)
    if kind is not None:
      return Token(kind, pos, pos + 1, c)
    if c == "<" and text.startswith("<=", pos):
      return Token(Tok.LEQ, pos, pos + 2, "<=")
    if c == "%":
      m = _PERCENT_NAME.match(text, pos)
      if m is None:
        self.error("expected a name after '%'", pos)
      return Token(Tok.NAME, pos, m.end(), m.group(1))
    if c == "." and text.startswith("...", pos):
      return Token(Tok.DOTS, pos, pos + 3, "...")
    if c in _STRING:
      m = _STRING[c].match(text, pos)
      if m is None:
        self.error("unterminated string", pos)
      return Token(Tok.STRING, pos, m.end(), unescape(m.group(1)))
    self.error(f"unexpected character {c!r}", pos)

  def _lex_identifier(self, pos: int) -> Token:
    text = self.text
    m = _IDENT.match(text, pos)
    end = m.end()
    ident = m.group()
    nxt = text[end:end + 1]
    if nxt == ":":
      return Token(Tok.NAME, pos, end + 1, ident)
    if nxt == "=":
      return Token(Tok.ATTRIBUTE_NAME, pos, end + 1, ident)
    if dtypes.is_element_type(ident):
      return Token(Tok.PRIMITIVE_TYPE, pos, end, ident)
    if ident == "nan":
      if nxt == "(":
        p = _NAN_PAYLOAD.match(text, end)
        if p is None:
          self.error("invalid NaN payload", end)
        return Token(Tok.DECIMAL, pos, p.end(), float("nan"))
      return Token(Tok.DECIMAL, pos, end, float("nan"))
    if ident in KEYWORDS:
      return Token(Tok.KEYWORD, pos, end, ident)
    d = _DIM_LABELS.match(text, pos)
    if d is not None:
      return Token(Tok.DIM_LABELS, pos, d.end(), d.group())
    return Token(Tok.IDENT, pos, end, ident)

  def _lex_number_or_pattern(self, pos: int) -> Token | None:
    text = self.text
    m = _FLOAT.match(text, pos)
    if m is not None:
      try:
        value = float(m.group())
      except ValueError:  # pragma: no cover - the pattern only admits floats
        value = float("nan")
      return Token(Tok.DECIMAL, pos, m.end(), value)
    for pattern, kind in ((_DIM_LABELS, Tok.DIM_LABELS), (_DXD, Tok.DXD),
                          (_PAD, Tok.PAD)):
      m = pattern.match(text, pos)
      if m is not None:
        return Token(kind, pos, m.end(), m.group())
    m = _INT.match(text, pos)
    if m is not None:
      value = int(m.group())
      # XLA lexes integers as int64, and non-negative ones up to uint64 max.
      if value < _INT64_MIN or value > _UINT64_MAX:
        self.error("integer out of range", pos)
      return Token(Tok.INT, pos, m.end(), value)
    if text.startswith("-inf", pos):
      return Token(Tok.NEG_INF, pos, pos + 4, float("-inf"))
    if text.startswith("-nan", pos):
      end = pos + 4
      if text.startswith("(", end):
        p = _NAN_PAYLOAD.match(text, end)
        if p is None:
          self.error("invalid NaN payload", end)
        end = p.end()
      return Token(Tok.DECIMAL, pos, end, float("nan"))
    return None

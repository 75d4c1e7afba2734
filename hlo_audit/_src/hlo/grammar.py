"""Token-level grammar pieces shared by the parser and the attribute decoders:
shapes, layouts, integer lists, shape indices and balanced groups.

Each function reads from a `Lexer` positioned at the start of the construct
and leaves it on the first token after it. Nesting is bounded (`MAX_DEPTH`)
so hostile input raises `HloParseError`, never `RecursionError`.
"""

from __future__ import annotations

import re

from hlo_audit._src.hlo import dtypes
from hlo_audit._src.hlo.values import (COMBINE_DIMENSION, UNBOUNDED, Layout, Shape,
                                   Tile)
from hlo_audit._src.hlo.lexer import Lexer, Tok, Token

#: Deepest nesting of tuples, groups or nested instructions we follow.
MAX_DEPTH = 200

_CLOSE = {Tok.LBRACE: Tok.RBRACE, Tok.LSQUARE: Tok.RSQUARE,
          Tok.LPAREN: Tok.RPAREN}


def expect(lx: Lexer, kind: Tok, message: str) -> Token:
  """Consumes a token of `kind` or raises `message` at the current token."""
  tok = lx.tok
  if tok.kind is not kind:
    lx.error(f"{message}, found {_describe(tok)}")
  lx.lex()
  return tok


def eat(lx: Lexer, kind: Tok) -> bool:
  """Consumes the current token if it is of `kind`."""
  if lx.tok.kind is kind:
    lx.lex()
    return True
  return False


def _describe(tok: Token) -> str:
  if tok.kind is Tok.EOF:
    return "end of input"
  return f"{tok.kind.value} {str(tok.value)[:40]!r}" if tok.kind in (
      Tok.NAME, Tok.IDENT, Tok.ATTRIBUTE_NAME, Tok.KEYWORD, Tok.STRING,
      Tok.PRIMITIVE_TYPE, Tok.INT, Tok.DECIMAL) else tok.kind.value


def describe(tok: Token) -> str:
  """A short description of a token for error messages."""
  return _describe(tok)


def parse_int(lx: Lexer, what: str = "integer") -> int:
  tok = lx.tok
  if tok.kind is not Tok.INT:
    lx.error(f"expected {what}, found {_describe(tok)}")
  lx.lex()
  return tok.value  # type: ignore[return-value]


def parse_int_list(lx: Lexer, open_: Tok = Tok.LBRACE,
                   close: Tok = Tok.RBRACE) -> tuple[int, ...]:
  """`{1, 2, 3}` (or with other delimiters) -> (1, 2, 3)."""
  expect(lx, open_, f"expected {open_.value} to start a list")
  out = []
  if lx.tok.kind is not close:
    while True:
      out.append(parse_int(lx))
      if not eat(lx, Tok.COMMA):
        break
  expect(lx, close, f"expected {close.value} to end a list")
  return tuple(out)


def parse_shape_index(lx: Lexer) -> tuple[int, ...]:
  """`{0, 1}` -> (0, 1)."""
  return parse_int_list(lx)


def can_be_shape(lx: Lexer) -> bool:
  """Whether the current token can start a shape (as XLA's CanBeShape)."""
  tok = lx.tok
  return (tok.kind is Tok.PRIMITIVE_TYPE or tok.kind is Tok.LPAREN or
          (tok.kind is Tok.IDENT and tok.value == "b" and
           lx.peek().kind is Tok.LPAREN))


def parse_shape(lx: Lexer, depth: int = 0) -> Shape:
  """shape ::= type '[' dims ']' layout? | '(' shapes ')' | 'b(' shape ')'."""
  if depth > MAX_DEPTH:
    lx.error("shape nested too deeply")
  tok = lx.tok
  if tok.kind is Tok.IDENT and tok.value == "b" and lx.peek().kind is Tok.LPAREN:
    lx.lex()
    lx.lex()
    inner = parse_shape(lx, depth + 1)
    expect(lx, Tok.RPAREN, "expected ')' at the end of buffer shape")
    return Shape(inner.element_type, inner.dims, inner.dynamic_dims,
                 inner.tuple_shapes, inner.layout, is_buffer=True)
  if tok.kind is Tok.LPAREN:
    lx.lex()
    elements = []
    if lx.tok.kind is not Tok.RPAREN:
      while True:
        elements.append(parse_shape(lx, depth + 1))
        if not eat(lx, Tok.COMMA):
          break
    expect(lx, Tok.RPAREN, "expected ')' at the end of tuple shape")
    return Shape("tuple", tuple_shapes=tuple(elements))
  if tok.kind is not Tok.PRIMITIVE_TYPE:
    lx.error(f"expected a shape, found {_describe(tok)}")
  element_type = tok.value
  lx.lex()
  expect(lx, Tok.LSQUARE, "expected '[' after element type")
  dims: list[int] = []
  dynamic: list[bool] = []
  if lx.tok.kind is not Tok.RSQUARE:
    while True:
      if lx.tok.kind is Tok.QUESTION:
        lx.lex()
        dims.append(UNBOUNDED)
        dynamic.append(True)
      else:
        is_dynamic = eat(lx, Tok.LEQ)
        at = lx.tok.start
        d = parse_int(lx, "dimension size")
        if d < 0:
          lx.error(f"negative dimension size {d}", at)
        dims.append(d)
        dynamic.append(is_dynamic)
      if not eat(lx, Tok.COMMA):
        break
  expect(lx, Tok.RSQUARE, "expected ']' to end dimensions")
  layout = None
  # '{' after a shape opens a layout only if an integer or ':' follows;
  # otherwise it opens a computation body (`-> f32[2] {`), as in XLA.
  if lx.tok.kind is Tok.LBRACE:
    nxt = lx.peek().kind
    if nxt is Tok.INT or nxt is Tok.COLON:
      at = lx.tok.start
      layout = parse_layout(lx, depth)
      if len(layout.minor_to_major) != len(dims):
        lx.error(f"layout {layout} has {len(layout.minor_to_major)} "
                 f"dimensions, shape has {len(dims)}", at)
  return Shape(element_type, tuple(dims),
               tuple(dynamic) if any(dynamic) else (), (), layout)


def parse_layout(lx: Lexer, depth: int = 0) -> Layout:
  """layout ::= '{' minor_to_major (':' D(...) T(...) L() #() *() E() S() SC() P() M())? '}'."""
  expect(lx, Tok.LBRACE, "expected '{' to start a layout")
  minor_to_major: list[int] = []
  if lx.tok.kind is Tok.INT:
    while True:
      minor_to_major.append(parse_int(lx))
      if not eat(lx, Tok.COMMA):
        break
  fields: dict = {}
  if eat(lx, Tok.COLON):
    if _ident_is(lx, "D"):
      lx.lex()
      expect(lx, Tok.LPAREN, "expected '(' after D")
      levels = []
      if lx.tok.kind is not Tok.RPAREN:
        while True:
          t = lx.tok
          if t.kind is not Tok.IDENT or t.value not in ("D", "C", "S", "H"):
            lx.error("expected a dim level type (D, C, S or H)")
          lx.lex()
          suffix = ""
          if eat(lx, Tok.PLUS):
            suffix += "+"
          if eat(lx, Tok.TILDE):
            suffix += "~"
          levels.append(t.value + suffix)
          if not eat(lx, Tok.COMMA):
            break
      expect(lx, Tok.RPAREN, "expected ')' after dim level types")
      fields["dim_level_types"] = tuple(levels)
    if _ident_is(lx, "T"):
      lx.lex()
      tiles = []
      while lx.tok.kind is Tok.LPAREN:
        lx.lex()
        tdims = []
        if lx.tok.kind is not Tok.RPAREN:
          while True:
            if eat(lx, Tok.ASTERISK):
              tdims.append(COMBINE_DIMENSION)
            else:
              tdims.append(parse_int(lx, "tile size"))
            if not eat(lx, Tok.COMMA):
              break
        expect(lx, Tok.RPAREN, "expected ')' to end a tile")
        tiles.append(Tile(tuple(tdims)))
      if not tiles:
        lx.error("expected '(' after T")
      fields["tiles"] = tuple(tiles)
    if _ident_is(lx, "L"):
      lx.lex()
      fields["tail_padding_alignment"] = _paren_int(lx)
    if lx.tok.kind is Tok.OCTOTHORP:
      lx.lex()
      fields["index_type"] = _paren_unsigned_type(lx)
    if lx.tok.kind is Tok.ASTERISK:
      lx.lex()
      fields["pointer_type"] = _paren_unsigned_type(lx)
    if _ident_is(lx, "E"):
      lx.lex()
      fields["element_size_bits"] = _paren_int(lx)
    if _ident_is(lx, "S"):
      lx.lex()
      fields["memory_space"] = _paren_int(lx)
    if _ident_is(lx, "SC"):
      lx.lex()
      configs = []
      while lx.tok.kind is Tok.LPAREN:
        lx.lex()
        dim = parse_int(lx)
        expect(lx, Tok.COLON, "expected ':' in split config")
        idx = []
        if lx.tok.kind is not Tok.RPAREN:
          while True:
            idx.append(parse_int(lx))
            if not eat(lx, Tok.COMMA):
              break
        expect(lx, Tok.RPAREN, "expected ')' to end a split config")
        configs.append((dim, tuple(idx)))
      fields["split_configs"] = tuple(configs)
    if _ident_is(lx, "P"):
      lx.lex()
      expect(lx, Tok.LPAREN, "expected '(' after P")
      fields["physical_shape"] = parse_shape(lx, depth + 1)
      expect(lx, Tok.RPAREN, "expected ')' after physical shape")
    if _ident_is(lx, "M"):
      lx.lex()
      fields["dynamic_metadata_prefix_bytes"] = _paren_int(lx)
  expect(lx, Tok.RBRACE, "expected '}' to end the layout")
  return Layout(tuple(minor_to_major), **fields)


def _ident_is(lx: Lexer, value: str) -> bool:
  return lx.tok.kind is Tok.IDENT and lx.tok.value == value


def _paren_int(lx: Lexer) -> int:
  expect(lx, Tok.LPAREN, "expected '('")
  v = parse_int(lx)
  expect(lx, Tok.RPAREN, "expected ')'")
  return v


def _paren_unsigned_type(lx: Lexer) -> str:
  expect(lx, Tok.LPAREN, "expected '('")
  tok = lx.tok
  if tok.kind is not Tok.PRIMITIVE_TYPE or dtypes.kind_of(tok.value) is not dtypes.Kind.UNSIGNED:
    lx.error("expected an unsigned integer type")
  lx.lex()
  expect(lx, Tok.RPAREN, "expected ')'")
  return tok.value  # type: ignore[return-value]


def skip_group(lx: Lexer) -> None:
  """Consumes a balanced `{...}`, `[...]` or `(...)` group, iteratively."""
  stack = [_CLOSE[lx.tok.kind]]
  opened = lx.tok.start
  lx.lex()
  while stack:
    kind = lx.tok.kind
    if kind is Tok.EOF:
      lx.error(f"unbalanced group: missing {stack[-1].value}", opened)
    if kind in _CLOSE:
      stack.append(_CLOSE[kind])
      if len(stack) > MAX_DEPTH:
        lx.error("brackets nested too deeply")
    elif kind in (Tok.RBRACE, Tok.RSQUARE, Tok.RPAREN):
      if kind is not stack[-1]:
        lx.error(f"expected {stack[-1].value}, found {kind.value}")
      stack.pop()
    lx.lex()


_BRACE_CHUNK = re.compile(r'[^{}"/]+|"(?:[^"\\]|\\.)*"|/\*.*?\*/|//[^\n\r]*|.', re.DOTALL)


def _nested_braces(depth: int) -> re.Pattern:
  """A `{...}` group nested at most `depth` deep, read as `scan_braces`
  reads it (strings and comments skipped) in one match: a module header's
  `input_output_alias` has thousands of groups, a Python step each."""
  inner = (r'[^{}"/]++|"[^"\\]*+(?:\\.[^"\\]*+)*+"|/\*[^*]*+\*++(?:[^/*][^*]*+\*++)*+/'
           r'|//[^\n\r]*+|/(?![/*])')
  group = r"\{(?:" + inner + r")*+\}"
  for _ in range(depth - 1):
    group = r"\{(?:" + inner + "|" + group + r")*+\}"
  return re.compile(group, re.DOTALL)


_PLAIN_BRACES = _nested_braces(8)


def scan_braces(lx: Lexer, pos: int) -> int:
  """End offset of the `{...}` group opening at `pos` of `lx.text`.

  Scans characters, not tokens (as XLA's LexJsonDict does): strings and
  comments are skipped and anything else is allowed inside, such as the MLIR
  text of frontend attributes (`#sdy.mesh<[]>`) or template JSON.
  """
  plain = _PLAIN_BRACES.match(lx.text, pos)
  if plain is not None:  # what `scan_brace_chunks` would find
    return plain.end()
  return scan_brace_chunks(lx, pos)


def scan_brace_chunks(lx: Lexer, pos: int) -> int:
  """`scan_braces` a chunk at a time: any depth, and errors."""
  depth = 0
  for m in _BRACE_CHUNK.finditer(lx.text, pos):
    c = m.group()
    if c == "{":
      depth += 1
      if depth > MAX_DEPTH:
        lx.error("braces nested too deeply", m.start())
    elif c == "}":
      depth -= 1
      if depth == 0:
        return m.end()
    elif c == '"':
      lx.error("unterminated string", m.start())
  lx.error("unbalanced '{': missing '}'", pos)


def is_open(kind: Tok) -> bool:
  return kind in _CLOSE

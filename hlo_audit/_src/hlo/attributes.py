"""Decoders from raw attribute text to typed values.

Each decoder takes the raw text of one attribute value and a `where` that
locates it in the module text (so errors carry the right line and column),
and returns an IR value type. They are pure and run lazily, on first access.
"""

from __future__ import annotations

import re
import types
from sys import intern
from typing import Protocol

from hlo_audit._src.hlo import dtypes, grammar
from hlo_audit._src.hlo.values import (ConvDimensionNumbers, Metadata, ModuleAlias,
                                   OutputOperandAlias, PaddingDim,
                                   ProgramShape, SliceDim, TextContext,
                                   WindowDim)
from hlo_audit._src.hlo.lexer import Lexer, Tok, unescape


class Where(Protocol):
  """Locates a raw value in the module text."""

  @property
  def ctx(self) -> TextContext | None: ...

  def offset(self) -> int: ...


def _lexer(raw: str, where: Where | None) -> tuple[Lexer, int]:
  ctx = where.ctx if where is not None else None
  base = where.offset() if where is not None else -1
  if ctx is not None and base >= 0 and ctx.text.startswith(raw, base):
    return Lexer(ctx.text, base, ctx.source), base + len(raw)
  return Lexer(raw, 0), len(raw)


def _finish(lx: Lexer, end: int) -> None:
  if lx.tok.kind is not Tok.EOF and lx.tok.start < end:
    lx.error(f"unexpected {grammar.describe(lx.tok)} after the value")


# Unrolled ("normal* (special normal*)*"): a third faster than an
# alternation per character on dumps, where strings are most of the text.
_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"


def _braced(depth: int) -> str:
  inner = r'[^{}"\n/]++|/(?![/*])|' + _STR
  b = r"\{(?:" + inner + r")*+\}"
  for _ in range(depth):
    b = r"\{(?:" + inner + "|" + b + r")*+\}"
  return b


#: One attribute value in its common one-line forms: flat braces (metadata),
#: strings, bare words, nested braces (JSON backend configs, shardings), and
#: iota device lists `[2,2]<=[4]T(1,0)`. Atomic, so a run of attributes
#: splits one way only.
#: (ETYPES: the element type names as an alternation, longest first; the
#: parser's patterns use it too.)
ETYPES = "|".join(sorted(dtypes.ELEMENT_TYPES, key=len, reverse=True))
#: A bare value the lexer reads as exactly one token, without error: dim
#: labels, a padding pattern, a float, an integer that fits, `%name`, or an
#: identifier that is not an element type (which would start a shape).
#: Digits are ASCII: `\d` would take digits the lexer rejects.
_BARE = (r"[0-9bf?]{2,}_[0-9io?]{2,}->[0-9bf?]{2,}"
         r"|-?[0-9]+_-?[0-9]+(?:_[0-9]+)?(?:x-?[0-9]+_-?[0-9]+(?:_[0-9]+)?)*"
         r"|-?[0-9]+(?:\.[0-9]*(?:[eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+)|-?[0-9]{1,18}(?![0-9])"
         r"|%?(?!(?:" + ETYPES + r")(?![A-Za-z0-9_.\-]))[A-Za-z_][A-Za-z0-9_.\-]*")
#: A list of integers in brackets, as in iota device lists.
_INTS = r"\[(?:[ \t,]|[0-9]{1,18}(?![0-9]))*\]"
# Braced values hold no comment starts outside strings: the slow path
# (`grammar.scan_braces`) skips comments there.
VALUE = (r"(?>\{[^{}\"\n/]*+(?:(?:" + _STR + r"|/(?![/*]))[^{}\"\n/]*+)*+\}|" + _STR +
         r"|(?:" + _BARE + r")(?![A-Za-z0-9_.?%\-])|" + _braced(6) +
         r"|" + _INTS + r"(?:<=" + _INTS + r"(?:T\((?:[ \t,]|[0-9]{1,18}(?![0-9]))*\))?)?)")
#: One value where it starts (`Instruction.attribute`'s reads of unsplit runs).
VALUE_AT = re.compile(VALUE)
#: One `, name=value` attribute, capturing the whole, the name and the value.
ATTRIBUTE = re.compile(r"(,[ \t]*(" + _NAME + r")=(" + VALUE + r")[ \t]*)")
#: A run of attributes, without captures (for embedding in line patterns).
#: Possessive: an attribute it took is never given back (what follows a run
#: cannot start with ','), and no backtracking state is kept per attribute.
ATTRIBUTE_RUN = r"(?:,[ \t]*+" + _NAME + "=" + VALUE + r"[ \t]*+)*+"


def split_attributes(run: str, where: Where | None = None):
  """`, k=v, k2=v2` (as the fast path keeps it) -> read-only {k: v}.

  Raises:
    HloParseError: if the run does not split cleanly or repeats a key.
  """
  found = ATTRIBUTE.findall(run)
  out = {}
  covered = 0
  for whole, key, value in found:
    if key in out:
      lx, _ = _lexer(run, where)
      base = lx.tok.start
      lx.error(f"attribute {key} given twice", base + run.find(whole, covered))
    out[intern(key)] = value  # a few keys, each on thousands of instructions
    covered += len(whole)
  if covered != len(run):
    lx, _ = _lexer(run, where)
    lx.error("malformed attribute list")
  return types.MappingProxyType(out)


def unescape_text(body: str) -> str:
  """C escapes of a string body decoded (the quotes already stripped)."""
  return unescape(body)


def string(raw: str, where: Where | None = None) -> str:
  """`"text"` -> text, with C escapes decoded."""
  lx, end = _lexer(raw, where)
  tok = grammar.expect(lx, Tok.STRING, "expected a string")
  _finish(lx, end)
  return tok.value  # type: ignore[return-value]


def integer(raw: str, where: Where | None = None) -> int:
  lx, end = _lexer(raw, where)
  v = grammar.parse_int(lx)
  _finish(lx, end)
  return v


#: `{1,2}` as XLA prints it: integers the lexer reads without question.
_PLAIN_INT_LIST = re.compile(r"\{(?:-?(?:0|[1-9][0-9]{0,17})(?:,-?(?:0|[1-9][0-9]{0,17}))*)?\}\Z")


def int_list(raw: str, where: Where | None = None) -> tuple[int, ...]:
  """`{1,2}` -> (1, 2)."""
  if _PLAIN_INT_LIST.match(raw) is not None:
    return tuple(map(int, raw[1:-1].split(","))) if len(raw) > 2 else ()
  lx, end = _lexer(raw, where)
  v = grammar.parse_int_list(lx)
  _finish(lx, end)
  return v


def bool_list(raw: str, where: Where | None = None) -> tuple[bool, ...]:
  """`{true,false}` or a single `true` -> (True, False)."""
  lx, end = _lexer(raw, where)
  out = []
  single = lx.tok.kind is Tok.KEYWORD and lx.tok.value in ("true", "false")
  if not single:
    grammar.expect(lx, Tok.LBRACE, "expected '{' to start a boolean list")
  while lx.tok.kind is Tok.KEYWORD and lx.tok.value in ("true", "false"):
    out.append(lx.tok.value == "true")
    lx.lex()
    if single or not grammar.eat(lx, Tok.COMMA):
      break
  if not single:
    grammar.expect(lx, Tok.RBRACE, "expected '}' to end a boolean list")
  _finish(lx, end)
  return tuple(out)


#: A `%name` reference as the lexer reads one NAME token (its `_PERCENT_NAME`).
COMPUTATION_REF = "%" + _NAME
_ONE_COMPUTATION = re.compile("(" + COMPUTATION_REF + r")\Z")


def computation_list(raw: str, where: Where | None = None) -> tuple[str, ...]:
  """`%comp` or `{%a, %b}` -> names."""
  m = _ONE_COMPUTATION.match(raw)
  if m is not None:  # nearly every call: no lexer, no search for the offset
    return (m.group(1)[1:],)
  lx, end = _lexer(raw, where)
  names = []
  if grammar.eat(lx, Tok.LBRACE):
    if lx.tok.kind is not Tok.RBRACE:
      while True:
        names.append(_name(lx))
        if not grammar.eat(lx, Tok.COMMA):
          break
    grammar.expect(lx, Tok.RBRACE, "expected '}' to end a computation list")
  else:
    names.append(_name(lx))
  _finish(lx, end)
  return tuple(names)


def _name(lx: Lexer) -> str:
  tok = lx.tok
  if tok.kind not in (Tok.NAME, Tok.IDENT):
    lx.error(f"expected a name, found {grammar.describe(tok)}")
  lx.lex()
  return tok.value  # type: ignore[return-value]


def slice_ranges(raw: str, where: Where | None = None) -> tuple[SliceDim, ...]:
  """`{[0:2], [1:9:2]}` -> SliceDims."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start slice ranges")
  out = []
  if lx.tok.kind is not Tok.RBRACE:
    while True:
      grammar.expect(lx, Tok.LSQUARE, "expected '[' to start a slice range")
      parts = [grammar.parse_int(lx)]
      while grammar.eat(lx, Tok.COLON):
        parts.append(grammar.parse_int(lx))
      if len(parts) not in (2, 3):
        lx.error("expected start:limit or start:limit:stride")
      grammar.expect(lx, Tok.RSQUARE, "expected ']' to end a slice range")
      out.append(SliceDim(*parts))
      if not grammar.eat(lx, Tok.COMMA):
        break
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end slice ranges")
  _finish(lx, end)
  return tuple(out)


def _dxd(lx: Lexer, what: str) -> list[int]:
  tok = lx.tok
  if tok.kind is Tok.INT:
    lx.lex()
    return [tok.value]  # type: ignore[list-item]
  if tok.kind is Tok.DXD:
    lx.lex()
    return [int(x) for x in tok.value.split("x")]  # type: ignore[union-attr]
  lx.error(f"expected {what} like 3 or 3x3, found {grammar.describe(tok)}")


def _pad_pairs(lx: Lexer, text: str, width: tuple[int, ...]) -> list[list[int]]:
  out = []
  for part in text.split("x"):
    nums = [int(x) for x in re.findall(r"-?\d+", part)]
    if len(nums) not in width:
      lx.error(f"malformed padding {text!r}")
    out.append(nums)
  return out


_WINDOW_INT = r"(?:0|[1-9][0-9]{0,8})"
_WINDOW_DXD = _WINDOW_INT + r"(?:x" + _WINDOW_INT + r")*"
#: A window as XLA prints most: plain sizes, strides, paddings and dilations
#: in its order, each once (`window` reads the rest with the lexer).
_PLAIN_WINDOW = re.compile(
    r"\{size=(" + _WINDOW_DXD + r")(?: stride=(" + _WINDOW_DXD + r"))?"
    r"(?: pad=(" + _WINDOW_INT + "_" + _WINDOW_INT + r"(?:x" + _WINDOW_INT + "_" +
    _WINDOW_INT + r")*))?(?: lhs_dilate=(" + _WINDOW_DXD + r"))?(?: rhs_dilate=(" +
    _WINDOW_DXD + r"))?\}")
_PLAIN_WINDOW_KEYS = ("size", "stride", "pad", "lhs_dilate", "rhs_dilate")


def window(raw: str, where: Where | None = None) -> tuple[WindowDim, ...]:
  """`{size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`."""
  m = _PLAIN_WINDOW.fullmatch(raw)
  if m is not None:  # (pooling and their gradients: every reduce-window)
    fields: dict[str, list] = {}
    for key, text in zip(_PLAIN_WINDOW_KEYS, m.groups()):
      if text is not None:
        fields[key] = ([[int(n) for n in p.split("_")] for p in text.split("x")]
                       if key == "pad" else [int(n) for n in text.split("x")])
    return _window_dims(fields)
  return _window_dims(_window_fields(raw, where))


def _window_fields(raw: str, where: Where | None = None) -> dict[str, list]:
  """A window's sub-attributes, read with the lexer."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start a window")
  fields: dict[str, list] = {}
  while lx.tok.kind is Tok.ATTRIBUTE_NAME:
    key = lx.tok.value
    at = lx.tok.start
    lx.lex()
    if key in fields:
      lx.error(f"window attribute {key!r} given twice", at)
    if key == "pad":
      tok = lx.tok
      if tok.kind not in (Tok.PAD, Tok.INT):
        lx.error(f"expected window padding like 0_0x1_1, found {grammar.describe(tok)}")
      lx.lex()
      fields[key] = _pad_pairs(lx, str(tok.value), (2,))
    elif key in ("size", "stride", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
      fields[key] = _dxd(lx, key)
    else:
      lx.error(f"unknown window attribute {key!r}", at)
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end a window")
  _finish(lx, end)
  return fields


def _window_dims(fields: dict[str, list]) -> tuple[WindowDim, ...]:
  # XLA takes the rank from `size` and does not insist that the other
  # sub-attributes cover every dimension; missing entries take defaults.
  rank = len(fields["size"]) if "size" in fields else max(
      (len(v) for v in fields.values()), default=0)

  def get(key, i, default):
    v = fields.get(key)
    return v[i] if v is not None and i < len(v) else default

  return tuple(WindowDim(
      size=get("size", i, 1), stride=get("stride", i, 1),
      padding_low=get("pad", i, [0, 0])[0], padding_high=get("pad", i, [0, 0])[1],
      base_dilation=get("lhs_dilate", i, 1),
      window_dilation=get("rhs_dilate", i, 1),
      window_reversal=bool(get("rhs_reversal", i, 0))) for i in range(rank))


def padding_config(raw: str, where: Where | None = None) -> tuple[PaddingDim, ...]:
  """`0_0_0x1_2_0` -> PaddingDims (low, high, interior)."""
  lx, end = _lexer(raw, where)
  tok = lx.tok
  if tok.kind not in (Tok.PAD,):
    lx.error(f"expected a padding config like 0_0x1_1_0, found {grammar.describe(tok)}")
  lx.lex()
  _finish(lx, end)
  return tuple(PaddingDim(*nums) for nums in _pad_pairs(lx, str(tok.value), (2, 3)))


def dim_labels(raw: str, where: Where | None = None) -> ConvDimensionNumbers:
  """`b01f_01io->b01f` -> ConvDimensionNumbers."""
  lx, end = _lexer(raw, where)
  tok = lx.tok
  if tok.kind is not Tok.DIM_LABELS:
    lx.error(f"expected dim labels like b01f_01io->b01f, found {grammar.describe(tok)}")
  lx.lex()
  _finish(lx, end)
  text = str(tok.value)
  lhs, rest = text.split("_", 1)
  kernel, out = rest.split("->", 1)

  def spatial(labels: str) -> tuple[int, ...]:
    pos = {int(c): i for i, c in enumerate(labels) if c.isdigit()}
    return tuple(pos[k] for k in sorted(pos))

  def find(labels: str, c: str) -> int:
    i = labels.find(c)
    if i < 0:
      lx.error(f"dim labels {text!r} lack {c!r}", tok.start)
    return i

  return ConvDimensionNumbers(
      labels=text,
      input_batch=find(lhs, "b"), input_feature=find(lhs, "f"),
      input_spatial=spatial(lhs),
      kernel_input_feature=find(kernel, "i"),
      kernel_output_feature=find(kernel, "o"), kernel_spatial=spatial(kernel),
      output_batch=find(out, "b"), output_feature=find(out, "f"),
      output_spatial=spatial(out))


_MD_FIELD = re.compile(
    r'[ \t\r\n]*([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|-?[0-9]{1,18}(?![0-9])|'
    r'\{[^{}"]*\}|true|false)[ \t\r\n]*')
#: `{1, 2}` as the lexer reads it (ASCII digits, integers that fit).
_INT_LIST = re.compile(
    r"\{[ \t]*(?:-?[0-9]{1,18}(?![0-9])(?:[ \t]*,[ \t]*-?[0-9]{1,18}(?![0-9]))*)?[ \t]*\}")
_MD_STR = {"op_type", "op_name", "source_file", "deduplicated_name",
           "scheduling_name"}
_MD_INT = {"source_line", "source_end_line", "source_column",
           "source_end_column", "stack_frame_id"}


#: The form JAX's dumps give nearly every instruction (read in one match).
_MD_COMMON = re.compile(r'\{op_name="([^"\\]*)"(?: stack_frame_id=([0-9]{1,18}))?\}')


def metadata(raw: str, where: Where | None = None) -> Metadata:
  """`{op_name="jit(f)/mul" source_file="f.py" source_line=3}` -> Metadata."""
  m = _MD_COMMON.fullmatch(raw)
  if m is not None:
    frame = m.group(2)
    return Metadata(op_name=m.group(1), stack_frame_id=int(frame) if frame else 0)
  fields: dict = {}
  extra: dict[str, str] = {}
  if raw.startswith("{") and raw.endswith("}"):
    body = raw[1:-1]
    pos = 0
    n = len(body)
    while pos < n:
      m = _MD_FIELD.match(body, pos)
      if m is None:
        if body[pos:].strip(" \t\r\n") == "":
          break
        return _metadata_slow(raw, where)
      key, value = m.group(1), m.group(2)
      if key in fields or key in extra:
        return _metadata_slow(raw, where)
      if key in _MD_STR:
        if not value.startswith('"'):
          return _metadata_slow(raw, where)
        fields[key] = unescape(value[1:-1])
      elif key in _MD_INT:
        if not value.lstrip("-").isdigit():
          return _metadata_slow(raw, where)
        fields[key] = int(value)
      elif key == "profile_type":
        if _INT_LIST.fullmatch(value) is None:
          return _metadata_slow(raw, where)  # reports the error in place
        fields[key] = int_list(value)
      else:
        extra[key] = value
      pos = m.end()
      if pos < n and body[pos] == ",":
        pos += 1
    if body.rstrip(" \t\r\n").endswith(","):
      return _metadata_slow(raw, where)  # a trailing ',': the slow path says so
    if extra:
      fields["extra"] = types.MappingProxyType(extra)
    return Metadata(**fields)
  return _metadata_slow(raw, where)


def _metadata_slow(raw: str, where: Where | None) -> Metadata:
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start metadata")
  fields: dict = {}
  extra: dict[str, str] = {}
  while lx.tok.kind is not Tok.RBRACE:
    grammar.eat(lx, Tok.COMMA)
    tok = lx.tok
    if tok.kind is not Tok.ATTRIBUTE_NAME:
      lx.error(f"expected a metadata field like op_name=, found {grammar.describe(tok)}")
    key = tok.value
    lx.lex()
    if key in fields or key in extra:
      lx.error(f"metadata field {key!r} given twice", tok.start)
    if key in _MD_STR:
      fields[key] = grammar.expect(lx, Tok.STRING, f"expected a string for {key}").value
    elif key in _MD_INT:
      fields[key] = grammar.parse_int(lx, f"integer for {key}")
    elif key == "profile_type":
      fields[key] = grammar.parse_int_list(lx)
    else:
      start = lx.tok.start
      if grammar.is_open(lx.tok.kind):
        grammar.skip_group(lx)
      else:
        lx.lex()
      extra[key] = lx.text[start:lx.tok.start].strip()
  lx.lex()
  _finish(lx, end)
  if extra:
    fields["extra"] = types.MappingProxyType(extra)
  return Metadata(**fields)


def string_map(raw: str, where: Where | None = None):
  """`{key="value", k2="v2"}` (frontend attributes) -> read-only mapping."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start attributes")
  out: dict[str, str] = {}
  if lx.tok.kind is not Tok.RBRACE:
    while True:
      tok = lx.tok
      if tok.kind is not Tok.ATTRIBUTE_NAME:
        lx.error(f"expected key=, found {grammar.describe(tok)}")
      lx.lex()
      value = lx.tok
      if value.kind is Tok.STRING:
        out[tok.value] = value.value  # type: ignore[index]
        lx.lex()
      elif value.kind is Tok.LBRACE:
        # Raw text such as MLIR attributes: `{n = 1 : i32, t = dense<1>}`.
        end_at = grammar.scan_braces(lx, value.start)
        out[tok.value] = lx.text[value.start:end_at]  # type: ignore[index]
        lx.seek(end_at)
      else:
        start = value.start
        if grammar.is_open(value.kind):
          grammar.skip_group(lx)
        else:
          lx.lex()
        out[tok.value] = lx.text[start:lx.tok.start].strip()  # type: ignore[index]
      if not grammar.eat(lx, Tok.COMMA):
        break
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end attributes")
  _finish(lx, end)
  return types.MappingProxyType(out)


def output_operand_aliasing(raw: str, where: Where | None = None) -> tuple[OutputOperandAlias, ...]:
  """`{{0}: (1, {}), {1}: (2, {0})}` -> aliases."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start aliasing")
  out = []
  while lx.tok.kind is not Tok.RBRACE:
    output_index = grammar.parse_shape_index(lx)
    grammar.expect(lx, Tok.COLON, "expected ':' after the output index")
    grammar.expect(lx, Tok.LPAREN, "expected '(' before the operand")
    operand = grammar.parse_int(lx, "operand number")
    grammar.expect(lx, Tok.COMMA, "expected ',' after the operand number")
    operand_index = grammar.parse_shape_index(lx)
    grammar.expect(lx, Tok.RPAREN, "expected ')' after the operand index")
    out.append(OutputOperandAlias(output_index, operand, operand_index))
    if not grammar.eat(lx, Tok.COMMA):
      break
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end aliasing")
  _finish(lx, end)
  return tuple(out)


def module_aliasing(raw: str, where: Where | None = None) -> tuple[ModuleAlias, ...]:
  """`{ {0}: (0, {}, may-alias), {1}: (1, {}) }` -> ModuleAliases."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start input_output_alias")
  out = []
  while lx.tok.kind is not Tok.RBRACE:
    output_index = grammar.parse_shape_index(lx)
    grammar.expect(lx, Tok.COLON, "expected ':' after the output index")
    grammar.expect(lx, Tok.LPAREN, "expected '(' before the parameter")
    param = grammar.parse_int(lx, "parameter number")
    grammar.expect(lx, Tok.COMMA, "expected ',' after the parameter number")
    param_index = grammar.parse_shape_index(lx)
    must = False
    if grammar.eat(lx, Tok.COMMA):
      kind = lx.tok
      if kind.kind is not Tok.IDENT or kind.value not in ("may-alias", "must-alias"):
        lx.error("expected may-alias or must-alias")
      must = kind.value == "must-alias"
      lx.lex()
    grammar.expect(lx, Tok.RPAREN, "expected ')'")
    out.append(ModuleAlias(output_index, param, param_index, must))
    if not grammar.eat(lx, Tok.COMMA):
      break
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end input_output_alias")
  _finish(lx, end)
  return tuple(out)


def program_shape(raw: str, where: Where | None = None) -> ProgramShape:
  """`{(f32[2]{0}, s32[])->f32[2]{0}}` -> ProgramShape."""
  lx, end = _lexer(raw, where)
  grammar.expect(lx, Tok.LBRACE, "expected '{' to start a computation layout")
  grammar.expect(lx, Tok.LPAREN, "expected '(' before parameter shapes")
  params = []
  if lx.tok.kind is not Tok.RPAREN:
    while True:
      params.append(grammar.parse_shape(lx))
      if not grammar.eat(lx, Tok.COMMA):
        break
  grammar.expect(lx, Tok.RPAREN, "expected ')' after parameter shapes")
  grammar.expect(lx, Tok.ARROW, "expected '->' before the result shape")
  result = grammar.parse_shape(lx)
  grammar.expect(lx, Tok.RBRACE, "expected '}' to end a computation layout")
  _finish(lx, end)
  return ProgramShape(tuple(params), result)

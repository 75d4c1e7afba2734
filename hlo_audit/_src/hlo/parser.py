"""HLO text parser: text -> `HloModule`, accepting what XLA's parser accepts.

Two paths share one grammar:

* The fast path reads an instruction that sits on one line in the dialect XLA
  prints (`%x = f32[2]{0} add(%a, %b), metadata={...}`) with a few regular
  expressions, and keeps attribute values as raw text. Optimized dumps are
  almost entirely such lines.
* The slow path is a recursive-descent parser over `Lexer` tokens that mirrors
  `xla/hlo/parser/hlo_parser.cc`: nested instructions, inline computations,
  multi-line constants, omitted shapes, comments anywhere. Whenever the fast
  path meets anything it does not expect, it hands the statement to the slow
  path, so errors always come from one place, with line and column.

After parsing, names go through XLA's module-wide name uniquifier so that
instruction and computation names match what XLA itself reports.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import types
from collections.abc import Callable, Mapping
from itertools import chain
from types import MappingProxyType

from hlo_audit._src import compat
from hlo_audit._src.errors import HloParseError
from hlo_audit._src.gc_pause import paused_gc
from hlo_audit._src.hlo import attributes, dtypes, grammar, opcodes, shape_inference
from hlo_audit._src.hlo.ir import (COMPUTATION_ROLES, Computation, FileLocation,
                                   HloModule, Instruction, Layout, Shape, StackFrame,
                                   StackFrameIndex, TextContext)
from hlo_audit._src.hlo.lexer import KEYWORDS, Lexer, Tok, error_at

__all__ = ["parse_hlo", "parse_hlo_file", "parse_shape"]

#: Ends the message of an operand that names no instruction defined before it.
_UNDEFINED = ": no instruction of that name before this use"

_log = logging.getLogger("hlo_audit")

_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
# Possessive: nothing a quantifier takes could be given back to a match
# (each stops where only a bracket can follow), and a tuple of hundreds of
# elements is read in runs, not a character at a time.
_SHAPE_RE = (r"[a-z][a-z0-9]*+\[[^\]\n]*+\]"
             r"(?:\{[0-9,]*+(?::[^{}()\n]*+(?:\([^()\n]*+\)[^{}()\n]*+)*+)?\})?"
             r"|\((?:[^()\n]++|\((?:[^()\n]++|\([^()\n]*+\))*+\))*+\)")
# The result shape on an instruction line: delimited, not checked (its text
# is looked up among the shapes parsed in full, or parsed then; a text that
# is no shape sends the line to the slow path). Possessive, and a layout any
# text in braces: a tenth of the line's match on dumps.
_LINE_SHAPE_RE = (r"[a-z][a-z0-9]*+\[[^\]\n]*+\](?:\{[^{}\n]*+\})?"
                  r"|\((?:[^()\n]++|\((?:[^()\n]++|\([^()\n]*+\))*+\))*+\)")
#: A value `attributes.VALUE` reads as `%name`: the computation a role names
#: in XLA's print.
_CALL_VALUE = (r"%(?!(?:" + attributes.ETYPES + r")(?![A-Za-z0-9_.\-]))" + _NAME +
               r"(?![A-Za-z0-9_.?%\-])")
#: `attributes.ATTRIBUTE_RUN`, capturing the `%name` of the last attribute
#: that names a computation as `calls=%c` (or to_apply, condition, body):
#: most lines with a role have one, which then needs no split.
_RUN_WITH_CALL = (r"(?:,[ \t]*+(?>(?:calls|to_apply|condition|body)=(" + _CALL_VALUE + r")|" +
                  _NAME + "=" + attributes.VALUE + r")[ \t]*+)*+")
# A whole instruction line in the dialect XLA prints; the attribute run is
# validated here and split on first use (ir.Instruction.attributes). Not for
# names starting with "__" but not "__xla_", which XLA renames (the slow path
# rejects them).
_FAST_LINE = re.compile(
    r"[ \t]*(ROOT[ \t]+)?(%?)(?!__(?!xla_))(" + _NAME + r")[ \t]*=[ \t]*(" + _LINE_SHAPE_RE +
    r")[ \t]+([a-z][a-z0-9\-]*)\(([^()\n]*)\)(" + _RUN_WITH_CALL +
    r")[ \t]*\r?(?:\n|\Z)"
    # Not when the statement may go on: `\n  , metadata={...}` adds attributes
    # (and the slow path glues `{`, `[`, `(`, `<=`, `T(` to the last value);
    # a comment next sends the line to the slow path too, which skips it.
    r"(?![ \t\r\n]*+(?:[,{(\[/]|<=|T\())")
# Attribute names the parser must see at once: called computations and
# control predecessors.
_STRUCTURAL_KEY = re.compile(
    r",[ \t]*(?:calls|to_apply|condition|body|branch_computations|"
    r"true_computation|false_computation|select|scatter|called_computations|"
    r"control-predecessors)=")
#: After a result shape, `{` then an integer or ':' opens a layout, not the
#: body (as in XLA); the lexer then reports the error in the layout.
_LAYOUT_START = re.compile(r"(?:[ \t\r\n]+|//[^\n\r]*|/\*[\s\S]*?\*/)*+(?:-?[0-9]|:)")
_ARRAY_SHAPE_RE = (r"[a-z][a-z0-9]*\[[^\]\n]*\]"
                   r"(?:\{[0-9,]*(?::[^{}()\n]*(?:\([^()\n]*\)[^{}()\n]*)*)?\})?")
#: A flat tuple shape's elements as XLA prints them (`, ` between elements,
#: `/*index=N*/` before every fifth): each element is looked up (memoized),
#: the lexer reads only element shapes not seen before.
_TUPLE_ELEMENT = re.compile(r"(?:,[ \t]*)?(?:/\*index=[0-9]+\*/)?(" + _ARRAY_SHAPE_RE + r")")
#: Typed operands, `f32[2,3]{1,0} %a` (the shape holds commas): the shape
#: and the name, separated by what XLA prints.
_TYPED_OPERAND = re.compile(
    r"[ \t]*(?:/\*index=[0-9]+\*/)?[ \t]*(?:(" + _SHAPE_RE + r")[ \t]+)?%(" + _NAME +
    r")[ \t]*(?:,|$)")
_SIG_PARAM_RE = _NAME + r":[ \t]*(?:" + _SHAPE_RE + r")[ \t]*"
#: An array shape without a layout, as signatures print parameters, that
#: `_plain_array_shape` reads: valid as written, no memo lookup needed.
#: (Common element types first: tried in order.)
_COMMON_TYPES = ("f32", "bf16", "s32", "pred", "f16", "s64", "u32", "u8")
_SIG_ARRAY = (r"(?:" + "|".join((*_COMMON_TYPES, *sorted(dtypes.ELEMENT_TYPES - set(_COMMON_TYPES)))) +
              r")\[(?:[0-9]{1,18}(?:,[0-9]{1,18})*)?\]")
_SIG_ARRAY_PARAM = _NAME + r":[ \t]*" + _SIG_ARRAY + r"[ \t]*"
#: A computation's header line in XLA's form: `ENTRY`, the name, and the
#: signature `(name: shape, ...) -> shape` if any (its shapes are checked
#: against the shape memo), up to the '{' that ends the line.
_FAST_HEADER = re.compile(
    r"[ \t]*(ENTRY[ \t]+)?(%?)(" + _NAME + r")[ \t]*(?:\(([ \t]*(?:" + _SIG_PARAM_RE +
    r"(?:,[ \t]*" + _SIG_PARAM_RE + r")*)?)\)[ \t]*->[ \t]*(" + _SHAPE_RE +
    r"))?[ \t]*\{[ \t]*\r?\Z")
#: `_FAST_HEADER` as `common_instructions` takes it, after the blank lines
#: and comments before it: the name written with '%', every parameter with a
#: `_SIG_ARRAY` shape (what `fast_header` looks up one by one), not before a
#: layout on the next line (`_LAYOUT_START`). Groups: ENTRY, name, result.
_COMMON_HEADER = re.compile(
    r"(?:[ \t\r\n]+|//[^\n\r]*)*+[ \t]*(ENTRY[ \t]+)?%(" + _NAME + r")[ \t]*\([ \t]*(?:" +
    _SIG_ARRAY_PARAM + r"(?:,[ \t]*" + _SIG_ARRAY_PARAM + r")*)?\)[ \t]*->[ \t]*(" + _SHAPE_RE +
    r")[ \t]*\{[ \t]*\r?(?=\n)(?!" + _LAYOUT_START.pattern + ")")
#: Each shape of a well-formed parameter list: names hold no ':', and a
#: ':' in a layout is inside the shape matched before it.
_SIG_SHAPE = re.compile(r":[ \t]*(" + _SHAPE_RE + r")")
_SIMPLE_REF = re.compile(r"%?(" + _NAME + r")")
_SIMPLE_NAMES = re.compile(r"\{(%?" + _NAME + r"(?:,[ \t]*%?" + _NAME + r")*)?\}")
_WS = re.compile(r"[ \t\r\n]*")
_TRIVIA = re.compile(r"(?:[ \t\r\n]+|//[^\n\r]*)*")
_FILE_NAME_ROW = re.compile(r"[ \t]*([0-9]{1,18})[ \t]+\"((?:[^\"\\]|\\.)*)\"[ \t]*\r?")
_FILE_LOC_ROW = re.compile(
    r"[ \t]*([0-9]{1,18})[ \t]+\{file_name_id=([0-9]{1,18}) "
    r"function_name_id=([0-9]{1,18}) line=(-?[0-9]{1,18}) end_line=(-?[0-9]{1,18}) "
    r"column=(-?[0-9]{1,18}) end_column=(-?[0-9]{1,18})\}[ \t]*\r?")
_FRAME_ROW = re.compile(
    r"[ \t]*([0-9]{1,18})[ \t]+\{file_location_id=([0-9]{1,18}) parent_frame_id=([0-9]{1,18})\}[ \t]*\r?")
_SIMPLE_ATOI = re.compile(r"[+-]?\d+")
_INT64_MAX = (1 << 63) - 1

_LIST_ROLES = frozenset({"branch_computations", "called_computations"})
_ROLES = frozenset(COMPUTATION_ROLES)
#: Attributes the parser decodes itself: called computations and
#: control predecessors (names to check and, rarely, rename).
_STRUCTURAL = (*COMPUTATION_ROLES, "control-predecessors")
_STRUCTURAL_SET = frozenset(_STRUCTURAL)
_RESERVED = frozenset(KEYWORDS | dtypes.ELEMENT_TYPES | {"nan"})
_TYPE_NAMES = dtypes.ELEMENT_TYPES
_ARITY = opcodes.ARITY
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
#: `, key=` at the start of each attribute, and possibly inside values: a
#: superset of a run's keys, to rule out repeated keys cheaply.
_ATTR_KEY = re.compile(r",[ \t]*(" + _NAME + r")=")
#: A constant's literal the lexer reads token by token without error:
#: numbers (integers that fit), true/false/inf/nan, `...`, braces, commas.
_FAST_LITERAL = re.compile(
    r"(?:[ \t]*(?>-?[0-9]+(?:\.[0-9]*(?:[eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+)|-?[0-9]{1,18}(?![0-9])|"
    r"true(?![\w.\-])|false(?![\w.\-])|-?inf(?![\w.\-])|-?nan(?![\w.\-(])|"
    r"\.\.\.|[{},]))*+[ \t]*")
_NOT_BRACE = re.compile(r"[^{}]+")
_PERCENT_NAMES = re.compile(r"%(" + _NAME + r")")
#: One attribute's whole text, key and value (the split `split_attributes` makes).
_ATTRIBUTES = attributes.ATTRIBUTE.findall
#: Roles `common_instructions` takes, as `role=%name`.
_SIMPLE_ROLES = frozenset({"calls", "to_apply", "condition", "body"})
#: A computation's closing '}' that no attribute (nor a comment that might
#: hide one) follows.
_COMP_END = re.compile(r"\}[ \t]*\r?(?:\n|\Z)(?![ \t\r\n]*+[,/])")
_EMPTY_ATTRS = types.MappingProxyType({})
#: (opcode, arity or None) of the opcodes `common_instructions` takes, as
#: written (not the async wrappers `_RESOLVE` adds); -1 for the two whose
#: parentheses hold no operands, `parameter(N)` and `constant(literal)`.
_COMMON_OPCODE = {op: (op, -1 if op in ("parameter", "constant") else _ARITY.get(op))
                  for op in opcodes.OPCODES}


#: An array shape with static dimensions and a plain layout, `bf16[8,41]{1,0}`:
#: most of a module's distinct shapes. Integers of at most 18 digits fit the
#: int64 the lexer checks for; anything else goes to the lexer.
_PLAIN_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[((?:[0-9]{1,18}(?:,[0-9]{1,18})*)?)\]"
                          r"(?:\{((?:[0-9]{1,18}(?:,[0-9]{1,18})*)?)\})?\Z")


def _plain_array_shape(text: str) -> Shape | None:
  """`text` as `_PLAIN_ARRAY` reads it, or None for the lexer to read (and to
  report errors in: a layout of the wrong rank, an unknown element type)."""
  m = _PLAIN_ARRAY.match(text)
  if m is None:
    return None
  element_type, dims_text, layout_text = m.groups()
  if not dtypes.is_element_type(element_type):
    return None
  dims = tuple(map(int, dims_text.split(","))) if dims_text else ()
  layout = None
  if layout_text is not None:
    if not layout_text:
      # `{}` opens a layout only before an integer or ':' (XLA): `f32[]{}`
      # is the lexer's to judge.
      return None
    minor_to_major = tuple(map(int, layout_text.split(",")))
    if len(minor_to_major) != len(dims):
      return None
    layout = Layout(minor_to_major)
  return Shape(element_type, dims, (), (), layout)


class _NameUniquer:
  """XLA's `NameUniquer` with "." as separator (xla/service/name_uniquer.cc)."""

  __slots__ = ("_generators",)

  def __init__(self):
    self._generators: dict[str, list] = {}

  def unique(self, prefix: str, clean: bool = False) -> str:
    """A unique name for `prefix`; `clean` skips sanitizing a name already
    known to be valid (every instruction name the parser accepted)."""
    root = prefix if clean else sanitize_name(prefix or "name")
    has_suffix = False
    number = 0
    sep = root.rfind(".")
    if 0 < sep < len(root) - 1:
      after = root[sep + 1:]
      if (after.isdigit() or _SIMPLE_ATOI.fullmatch(after)) and abs(int(after)) <= _INT64_MAX:
        number = int(after)
        has_suffix = True
        root = root[:sep]
    gen = self._generators.get(root)
    if gen is None:
      gen = self._generators[root] = [0, set()]
    used = gen[1]
    if number in used:
      nxt = gen[0]
      while nxt in used:
        nxt += 1
      used.add(nxt)
      gen[0] = nxt + 1
      number = nxt
    else:
      used.add(number)
    if number == 0:
      return root + ".0" if has_suffix else root
    return f"{root}.{number}"


_CLEAN = re.compile(_NAME)


def _plain_name(name: str) -> bool:
  """Whether XLA keeps `name` as is (no sanitizing needed)."""
  return not (dtypes.is_element_type(name) or
              (name[:2] == "__" and name[:6] != "__xla_"))


def sanitize_name(name: str) -> str:
  """XLA's `NameUniquer::GetSanitizedName`."""
  if not name:
    return ""
  if _CLEAN.fullmatch(name) and _plain_name(name):
    return name
  chars = list(name)
  if not (chars[0].isascii() and (chars[0].isalpha() or chars[0] == "_")):
    chars[0] = "_"
  for i in range(1, len(chars)):
    c = chars[i]
    if not (c.isascii() and (c.isalnum() or c in "_.-")):
      chars[i] = "_"
  out = "".join(chars)
  if dtypes.is_element_type(out):
    out += "_"
  if out.startswith("__") and not out.startswith("__xla_"):
    out = "a" + out[1:]
  return out


class _Comp:
  """A computation being built."""

  __slots__ = ("name", "offset", "names", "root_name", "root_offset",
               "is_entry", "thread", "param_count", "elements")

  def __init__(self, name: str, offset: int, is_entry: bool = False):
    self.name = name
    self.offset = offset
    self.names: dict[str, Instruction] = {}
    self.root_name: str | None = None
    self.root_offset = -1
    self.is_entry = is_entry
    self.thread = "main"
    self.param_count = 0
    #: (tuple, index path) -> the get-tuple-element made for `%tuple#i#j`.
    self.elements: dict[tuple[str, tuple[int, ...]], str] = {}


class _Parser:
  """One parse of one text. Use `parse_hlo`."""

  def __init__(self, text: str, source: str | None, fast: bool = True):
    self.text = text
    self.source = source
    self.fast = fast
    self.n = len(text)
    self.renames: dict[str, str] = {}
    self.ctx = TextContext(text, source, types.MappingProxyType(self.renames))
    self.shapes: dict[str, Shape] = {}
    self.done: list[_Comp] = []  # in XLA's computations_ order
    self.pool: dict[str, int] = {}  # computation name -> offset
    self.refs: list[tuple[str, int]] = []  # (computation name, offset)
    self.anon = _NameUniquer()  # XLA's parser-level uniquifier for anon names
    self.pending_names: list[str] = []
    self.entry: _Comp | None = None  # the ENTRY computation, once closed
    self.generated: dict[str, str] = {}  # placeholder -> base name
    self.single = False  # single-instruction mode creates missing parameters
    self.scopes = 0
    self.lx: Lexer | None = None

  # ---------------------------------------------------------------- errors --

  def error(self, offset: int, message: str):
    error_at(self.text, offset, message, self.source)

  def lexer_at(self, pos: int) -> Lexer:
    self.lx = Lexer(self.text, pos, self.source)
    return self.lx

  # ---------------------------------------------------------------- module --

  def parse(self) -> HloModule:
    nul = self.text.find("\0")
    if nul >= 0:
      self.error(nul, "NUL character in HLO text")
    lx = self.lexer_at(0)
    tok = lx.tok
    if tok.kind is Tok.EOF:
      self.error(0, "empty HLO text: expected 'HloModule', a computation or an instruction")
    if ((tok.kind is Tok.KEYWORD and tok.value in ("HloModule", "ENTRY")) or
        lx.peek().kind is Tok.LBRACE):
      return self.parse_module(with_header=tok.kind is Tok.KEYWORD and
                               tok.value == "HloModule")
    return self.parse_single_instruction()

  def parse_module(self, with_header: bool) -> HloModule:
    lx = self.lx
    name = None
    header: dict[str, str] = {}
    if with_header:
      lx.lex()
      tok = lx.tok
      if tok.kind not in (Tok.NAME, Tok.IDENT):
        lx.error(f"expected the module name after HloModule, found {grammar.describe(tok)}")
      name = tok.value
      lx.lex()
      header = self.parse_attributes(lx, module_header=True)
    pos = lx.tok.start
    stack_frames = None
    if lx.tok.kind is Tok.KEYWORD and lx.tok.value == "FileNames":
      stack_frames, pos = self.parse_stack_frame_index(lx.tok.end)
    while True:
      if self.fast:
        # Whole computations in the common forms, header to closing brace,
        # in one loop; it stops inside a computation at a line it does not
        # take (the general loop goes on from there) or before a header.
        comp, pos, m = self.common_instructions(None, pos, across=True)
        if comp is not None:
          pos = self.parse_instructions(comp, pos, m, resumed=True)
          continue
      pos = self.skip_trivia(pos)
      if pos >= self.n:
        break
      pos = self.parse_computation(pos)
    if not self.done:
      self.error(pos, "expected a computation")
    entry = self.entry
    if entry is None:
      entry = self.done[-1]
      entry.is_entry = True
    self.check_refs()
    return self.assemble(name, header, stack_frames, entry)

  def parse_single_instruction(self) -> HloModule:
    """A text holding one instruction: XLA makes missing operands parameters."""
    self.single = True
    comp = _Comp("_", 0, is_entry=True)
    lx = self.lx
    self.scopes = 1
    if grammar.can_be_shape(lx):
      self.parse_instruction_rhs(comp, "_", lx.tok.start, allow_attributes=True)
    else:
      self.parse_instruction(comp)
    if lx.tok.kind is not Tok.EOF:
      lx.error("expected end of input after a single instruction "
               "(is the 'HloModule' header missing?)")
    if comp.root_name is None:
      comp.root_name = next(reversed(comp.names))
    # XLA adds the entry first, then computations made along the way.
    self.done.insert(0, comp)
    self.check_refs()
    return self.assemble("_", {}, None, comp)

  def skip_trivia(self, pos: int) -> int:
    """Skips whitespace and comments; returns the next token's offset."""
    pos = _TRIVIA.match(self.text, pos).end()
    if self.text.startswith("/*", pos):
      return self.lexer_at(pos).tok.start
    return pos

  def parse_stack_frame_index(self, pos: int) -> tuple[StackFrameIndex, int]:
    """FileNames / FunctionNames / FileLocations / StackFrames tables."""
    file_names, pos = self.parse_string_rows(pos)
    pos = self.expect_keyword(pos, "FunctionNames")
    function_names, pos = self.parse_string_rows(pos)
    pos = self.expect_keyword(pos, "FileLocations")
    locations, pos = self.parse_rows(
        pos, _FILE_LOC_ROW, lambda g: FileLocation(*(int(x) for x in g[1:])),
        self.slow_file_location)
    pos = self.expect_keyword(pos, "StackFrames")
    frames, pos = self.parse_rows(
        pos, _FRAME_ROW, lambda g: StackFrame(int(g[1]), int(g[2]) - 1),
        self.slow_frame)
    return StackFrameIndex(tuple(file_names), tuple(function_names),
                           tuple(locations), tuple(frames)), pos

  def expect_keyword(self, pos: int, word: str) -> int:
    lx = self.lexer_at(pos)
    if not (lx.tok.kind is Tok.KEYWORD and lx.tok.value == word):
      lx.error(f"expected '{word}', found {grammar.describe(lx.tok)}")
    return lx.tok.end

  def parse_string_rows(self, pos: int) -> tuple[list[str], int]:
    out: list[str] = []
    lx = self.lexer_at(pos)
    while lx.tok.kind is Tok.INT:
      lx.lex()
      tok = grammar.expect(lx, Tok.STRING, "expected a string")
      out.append(tok.value)  # type: ignore[arg-type]
    return out, lx.tok.start

  def parse_rows(self, pos: int, row: re.Pattern, make: Callable,
                 slow: Callable[[Lexer], object]) -> tuple[list, int]:
    """Rows `N {k=v ...}` of a table: a regex per line, the lexer if odd."""
    text = self.text
    out = []
    while True:
      pos = self.skip_trivia(pos)
      if pos >= self.n or not text[pos].isdigit():
        return out, pos
      end = text.find("\n", pos)
      end = self.n if end < 0 else end
      m = row.match(text, pos, end)
      if m is not None and m.end() == end:
        out.append(make(m.groups()))
        pos = end
        continue
      lx = self.lexer_at(pos)
      lx.lex()
      out.append(slow(lx))
      pos = lx.tok.start

  def _sub_ints(self, lx: Lexer, keys: tuple[str, ...]) -> list[int]:
    grammar.expect(lx, Tok.LBRACE, "expected '{'")
    values: dict[str, int] = {}
    while lx.tok.kind is not Tok.RBRACE:
      grammar.eat(lx, Tok.COMMA)
      tok = lx.tok
      if tok.kind is not Tok.ATTRIBUTE_NAME or tok.value not in keys:
        lx.error(f"expected one of {', '.join(k + '=' for k in keys)}")
      if tok.value in values:
        lx.error(f"{tok.value} given twice")
      lx.lex()
      values[tok.value] = grammar.parse_int(lx)
    missing = [k for k in keys if k not in values]
    if missing:
      lx.error(f"missing {', '.join(missing)}")
    lx.lex()
    return [values[k] for k in keys]

  def slow_file_location(self, lx: Lexer) -> FileLocation:
    return FileLocation(*self._sub_ints(lx, (
        "file_name_id", "function_name_id", "line", "end_line", "column",
        "end_column")))

  def slow_frame(self, lx: Lexer) -> StackFrame:
    fl, parent = self._sub_ints(lx, ("file_location_id", "parent_frame_id"))
    return StackFrame(fl, parent - 1)

  # ------------------------------------------------------------ attributes --

  def parse_attributes(self, lx: Lexer, module_header: bool = False,
                       comp: _Comp | None = None,
                       allow: bool = True) -> dict[str, str]:
    """attributes ::= (',' name=value)*, values kept as raw text."""
    attrs: dict[str, str] = {}
    while lx.tok.kind is Tok.COMMA:
      if not allow:
        return attrs
      lx.lex()
      tok = lx.tok
      if tok.kind is not Tok.ATTRIBUTE_NAME:
        lx.error(f"expected an attribute like name=value, found {grammar.describe(tok)}")
      key = tok.value
      if key in attrs:
        lx.error(f"attribute {key} given twice")
      lx.lex()
      if comp is not None and key in _ROLES:
        attrs[key] = self.parse_computation_ref(lx, key in _LIST_ROLES)
      else:
        attrs[key] = self.raw_value(lx, key)  # type: ignore[index]
    return attrs

  def raw_value(self, lx: Lexer, key: str = "") -> str:
    """Consumes one attribute value and returns its text.

    A value is one unit (a token, a group, or a shape), followed by any
    groups and `<=`-joined units glued to it: `[2,2]<=[4]T(1,0)` and
    `mesh['x'=2] {'x'}` are single values. Braced values are scanned by
    characters, as XLA's LexJsonDict does for JSON and frontend attributes,
    so they may hold text the lexer has no tokens for.
    """
    start = lx.tok.start
    shape = self.value_unit(lx)
    if shape and key == "literal":
      self.value_unit(lx)  # `literal=s32[] 10`: a shape, then the data
    while True:
      kind = lx.tok.kind
      if kind is Tok.LEQ:
        lx.lex()
        self.value_unit(lx)
      elif grammar.is_open(kind):
        self.value_unit(lx)
      elif (kind is Tok.IDENT and lx.tok.value == "T" and
            lx.peek().kind is Tok.LPAREN):
        lx.lex()
        grammar.skip_group(lx)
      else:
        break
    return self.text[start:lx.prev_end]

  def value_unit(self, lx: Lexer) -> bool:
    """Consumes one unit of a value; True if it was a shape."""
    tok = lx.tok
    kind = tok.kind
    if kind is Tok.LBRACE:
      lx.seek(grammar.scan_braces(lx, tok.start))
      return False
    if grammar.is_open(kind):
      grammar.skip_group(lx)
      return False
    if kind is Tok.PRIMITIVE_TYPE or (kind is Tok.IDENT and tok.value == "b" and
                                      lx.peek().kind is Tok.LPAREN):
      grammar.parse_shape(lx)
      return True
    if kind in (Tok.EOF, Tok.COMMA, Tok.RBRACE, Tok.RPAREN, Tok.RSQUARE,
                Tok.EQUAL, Tok.ATTRIBUTE_NAME):
      lx.error(f"expected an attribute value, found {grammar.describe(tok)}")
    lx.lex()
    return False

  def parse_computation_ref(self, lx: Lexer, is_list: bool) -> str:
    """A called computation (name or inline `{...}` body), or a list of them.

    Inline bodies become computations of their own; the raw value names them.
    """
    if is_list:
      grammar.expect(lx, Tok.LBRACE, "expected '{' to start a computation list")
      names = []
      if lx.tok.kind is not Tok.RBRACE:
        while True:
          names.append(self.parse_one_computation_ref(lx))
          if not grammar.eat(lx, Tok.COMMA):
            break
      grammar.expect(lx, Tok.RBRACE, "expected '}' to end a computation list")
      return "{" + ", ".join("%" + n for n in names) + "}"
    return "%" + self.parse_one_computation_ref(lx)

  def parse_one_computation_ref(self, lx: Lexer) -> str:
    tok = lx.tok
    if tok.kind is Tok.LBRACE:
      # An inline computation body, named "_" as XLA names it.
      comp = _Comp(self.placeholder("_"), tok.start)
      self.parse_instruction_list(comp, lx)
      self.done.append(comp)
      return comp.name
    if tok.kind not in (Tok.NAME, Tok.IDENT):
      lx.error(f"expected a computation name, found {grammar.describe(tok)}")
    lx.lex()
    self.refs.append((tok.value, tok.start))  # type: ignore[arg-type]
    return tok.value  # type: ignore[return-value]

  def placeholder(self, base: str) -> str:
    """A unique stand-in name for a computation the parser makes; `assemble`
    replaces it with what XLA's uniquifier makes of `base`."""
    key = f"\0{len(self.generated)}\0"
    self.generated[key] = base
    return key

  # ----------------------------------------------------------- computation --

  def fast_header(self, pos: int) -> tuple[_Comp | None, int]:
    """The computation a header line in XLA's form opens at `pos` (after
    blank lines), and the offset after the line; None and the header's
    offset if the lexer must read it (or there is none)."""
    text = self.text
    h = _COMMON_HEADER.match(text, pos)
    if h is not None:  # (nearly every header of a dump: no shape to look up but the result's)
      entry, name, result = h.groups()
      if "//" not in result and (result in self.shapes or self.shape(result) is not None):
        return _Comp(name, h.start(2) - 1, bool(entry)), h.end() + 1
    pos = _TRIVIA.match(text, pos).end()
    if pos >= self.n or text.startswith("/*", pos):
      return None, pos
    end = text.find("\n", pos)
    end = self.n if end < 0 else end
    m = _FAST_HEADER.match(text, pos, end)
    if m is None:
      return None, pos
    entry, pct, name, params, result = m.groups()
    if not pct and _reserved(name):
      return None, pos
    if result is not None:
      # A `//` comment would hide the rest of the line from the lexer, and a
      # layout may follow the result shape on the next line.
      if "//" in params or "//" in result or _LAYOUT_START.match(text, end):
        return None, pos
      shapes = self.shapes
      if result not in shapes and self.shape(result) is None:
        return None, pos
      if params:
        found = _SIG_SHAPE.findall(params)
        if not (all(map(shapes.__contains__, found)) or
                all(self.shape(t) is not None for t in found)):
          return None, pos
    return _Comp(name, m.start(2), bool(entry)), end + 1 if end < self.n else end

  def parse_computation(self, pos: int) -> int:
    """One computation at `pos`; returns the offset after it. (The fast
    header is tried again here: the common loop stops before a block
    comment, which `skip_trivia` has skipped since.)"""
    if self.fast:
      comp, body = self.fast_header(pos)
      if comp is not None:
        return self.parse_instructions(comp, body)
    lx = self.lexer_at(pos)
    is_entry = False
    if lx.tok.kind is Tok.KEYWORD and lx.tok.value == "ENTRY":
      is_entry = True
      lx.lex()
    tok = lx.tok
    if tok.kind not in (Tok.NAME, Tok.IDENT):
      lx.error(f"expected a computation name, found {grammar.describe(tok)}")
    lx.lex()
    comp = _Comp(tok.value, tok.start, is_entry)  # type: ignore[arg-type]
    if lx.tok.kind is Tok.LPAREN:
      self.parse_param_list(lx)
      grammar.expect(lx, Tok.ARROW, "expected '->' after the parameter list")
      grammar.parse_shape(lx)
    if lx.tok.kind is not Tok.LBRACE:
      lx.error(f"expected '{{' to start the computation body, found {grammar.describe(lx.tok)}")
    return self.parse_instructions(comp, lx.tok.end)

  def parse_param_list(self, lx: Lexer) -> None:
    grammar.expect(lx, Tok.LPAREN, "expected '(' to start the parameter list")
    if lx.tok.kind is not Tok.RPAREN:
      while True:
        tok = lx.tok
        if tok.kind not in (Tok.NAME, Tok.IDENT):
          lx.error(f"expected a parameter name, found {grammar.describe(tok)}")
        lx.lex()
        grammar.parse_shape(lx)
        if not grammar.eat(lx, Tok.COMMA):
          break
    grammar.expect(lx, Tok.RPAREN, "expected ')' to end the parameter list")

  def parse_instructions(self, comp: _Comp, pos: int, m: re.Match | None = None,
                         resumed: bool = False) -> int:
    """Instructions up to the closing '}' (the '{' is consumed); then the
    computation's own attributes. Returns the offset after them. `resumed`:
    the common loop stopped at `pos`, where `_FAST_LINE` matched `m` (if
    not None)."""
    text = self.text
    match = _FAST_LINE.match if self.fast else None
    self.scopes += 1
    common = self.common_instructions if match is not None else None
    while True:
      if common is not None:
        if resumed:
          resumed = False
        else:
          _, pos, m = common(comp, pos)
        if m is not None and self.fast_instruction(comp, m):
          pos = m.end()
          continue
      pos = self.skip_trivia(pos)
      if pos >= self.n:
        self.error(pos, f"expected '}}' to end computation {comp.name}")
      if text[pos] == "}":
        if not comp.names:
          self.error(pos, "expected an instruction: a computation cannot be empty")
        break
      if match is not None:
        m = match(text, pos)
        if m is not None and self.fast_instruction(comp, m):
          pos = m.end()
          continue
      lx = self.lexer_at(pos)
      self.parse_instruction(comp)
      pos = lx.tok.start
    self.scopes -= 1
    end = _COMP_END.match(text, pos) if match is not None else None
    if end is not None:  # no attributes follow
      self.close_computation(comp)
      return end.end()
    lx = self.lexer_at(pos)
    lx.lex()  # the '}'
    attrs = self.parse_attributes(lx)
    for key, raw in attrs.items():
      if key != "execution_thread":
        self.error(lx.tok.start, f"unexpected computation attribute {key!r}")
      try:
        comp.thread = attributes.string(raw)
      except HloParseError as e:  # located in `raw` alone: relocate
        self.error(self.text.find(raw, pos), e.message)
    self.close_computation(comp)
    return lx.tok.start

  def parse_instruction_list(self, comp: _Comp, lx: Lexer) -> None:
    """An inline `{ instructions }` body, with the lexer on the '{'."""
    grammar.expect(lx, Tok.LBRACE, "expected '{'")
    self.scopes += 1
    if self.scopes > grammar.MAX_DEPTH:
      lx.error("computations nested too deeply")
    while True:
      self.parse_instruction(comp)
      if lx.tok.kind is Tok.RBRACE:
        break
      if lx.tok.kind is Tok.EOF:
        lx.error("expected '}' to end the inline computation")
    lx.lex()
    self.scopes -= 1
    self.finish_computation(comp)

  def close_computation(self, comp: _Comp) -> None:
    """A module-level computation is complete."""
    self.finish_computation(comp)
    self.done.append(comp)
    if comp.is_entry:
      if self.entry is not None:
        self.error(comp.offset, "expected only one ENTRY computation")
      self.entry = comp

  def finish_computation(self, comp: _Comp) -> None:
    if comp.name in self.pool:
      self.error(comp.offset, f"computation {comp.name} is defined twice "
                 f"(first at line {self.text.count(chr(10), 0, self.pool[comp.name]) + 1})")
    self.pool[comp.name] = comp.offset
    if comp.root_name is None:
      comp.root_name = next(reversed(comp.names))

  # ------------------------------------------------------------ fast path --

  def common_instructions(self, comp: _Comp | None, pos: int, across: bool = False
                          ) -> tuple[_Comp | None, int, re.Match | None]:
    """Instructions of `comp` from `pos` in the forms nearly every line of a
    dump takes, until the first that is not; returns the computation, that
    line's offset and `_FAST_LINE`'s match there, if any.

    `across`: at module level, from a computation's header (`comp` None) or
    inside one, going on over closing braces and headers in XLA's form;
    returns None for the computation when it stops before a header.

    The forms: `%name = shape op(%a, %b), attrs` with a known shape, operands
    defined, no repeated attribute, and computations referenced only as
    `calls=%c` (or to_apply, condition, body); `parameter(N)`. The rest goes
    through `fast_instruction`, which accepts the same and more: this loop
    saves per-line overhead, the largest cost of parsing a dump after the
    regular expression itself (and, on modules of thousands of small
    reducer computations, per-computation overhead).
    """
    text = self.text
    if comp is None:
      comp, pos = self.fast_header(pos)
      if comp is None:
        return None, pos, None
    match = _FAST_LINE.match
    names = comp.names
    shapes = self.shapes.get
    common_op = _COMMON_OPCODE.get
    attr_keys = _ATTR_KEY.findall
    contains = names.__contains__
    pending = self.pending_names.append
    ctx = self.ctx
    new = _new
    reserved, type_names = _RESERVED, _TYPE_NAMES  # (`fast_instruction` says why)
    while True:
      m = match(text, pos)
      if m is None:
        if not across or not names:
          return comp, pos, None
        end = _COMP_END.match(text, pos)
        if end is None:  # not a bare '}' at the start of the line
          return comp, pos, None
        self.close_computation(comp)
        comp, pos = self.fast_header(end.end())
        if comp is None:
          return None, pos, None
        names = comp.names
        contains = names.__contains__
        continue
      root_kw, pct, name, shape_text, word, ops, run, call = m.groups()
      spec = common_op(word)
      shape = shapes(shape_text)
      if (spec is None or shape is None or name in names or
          (root_kw and comp.root_name is not None) or
          (not pct and (name in reserved or text[m.end(3)] == "=")) or name in type_names):
        return comp, pos, m  # (a shape not seen yet, async wrappers: `fast_instruction`)
      opcode, arity = spec
      param = literal = None
      if not ops:
        operands = ()
      elif ops[0] == "%":
        # "%a, %b": split, not a regex; names found in `names` are valid.
        operands = tuple(ops[1:].split(", %"))
        if not all(map(contains, operands)):
          return comp, pos, m
      else:
        if arity == -1:  # (arity -1 rejects any other operand list)
          if opcode == "parameter":
            if not (ops.isdigit() and ops.isascii() and len(ops) <= 18):
              return comp, pos, m
            param = int(ops)
          else:
            literal = ops.strip()
            if not literal or not _fast_literal(literal):
              return comp, pos, m
          operands = ()
          arity = None
        else:
          # Names without '%' (Keras dumps), or typed, as flax dumps print
          # them: "f32[2,3]{1,0} %a, s32[] %b". No ", " inside a shape here:
          # `ops` holds no parentheses.
          out = ops.split(", ")
          if ops.count(" ") == len(out) - 1 and "%" not in ops:
            if not reserved.isdisjoint(out):  # the slow path would read a shape
              return comp, pos, m
          else:
            out = []
            for part in ops.split(", "):
              if " " in part:
                typed, _, part = part.rpartition(" ")
                if shapes(typed) is None and self.shape(typed) is None:
                  return comp, pos, m
              if part[:1] == "%":
                part = part[1:]
              elif part in reserved:  # the slow path would read a shape
                return comp, pos, m
              out.append(part)
          if not all(map(contains, out)):
            return comp, pos, m
          operands = tuple(out)
      if arity is not None and arity != len(operands):
        return comp, pos, m
      if not run:
        run = _EMPTY_ATTRS
      # Half the lines carry metadata alone: one brace group to the end.
      elif not (run.startswith(", metadata={") and run.find("}") == len(run) - 1):
        # Most others end in metadata: the keys before it (no string
        # there that could hold the `, metadata={` found), and it. A
        # superset of the keys (some may be inside values).
        at = run.find(", metadata={")
        if at > 0 and run.find("}", at) == len(run) - 1 and run.find('"', 0, at) < 0:
          keys = attr_keys(run, 0, at)
          keys.append("metadata")
        else:
          keys = attr_keys(run)
        if len(keys) > 1 and len(set(keys)) != len(keys):
          return comp, pos, m
        if not _STRUCTURAL_SET.isdisjoint(keys):
          if call is not None and sum(map(_STRUCTURAL_SET.__contains__, keys)) == 1:
            # The one role is a real attribute (`_RUN_WITH_CALL` took it).
            self.refs.append((call[1:], m.start(8)))
          elif not self.common_calls(run, m.start(7)):
            return comp, pos, m  # (`fast_instruction` writes bare names with '%')
      if root_kw:
        comp.root_name = name
      pending(name)
      # _make_instruction, inlined: a call per line is measurable here.
      inst = new(_MutableInstruction)
      inst.name = name
      inst.opcode = opcode
      inst.shape = shape
      inst.operands = operands
      inst.attribute_source = run
      inst.control_predecessors = ()
      inst.literal = literal
      inst.parameter_number = param
      inst.async_wrapped_opcode = None
      inst.offset = m.start(2)
      inst._ctx = ctx
      inst._cache = None
      inst.__class__ = Instruction
      names[name] = inst
      pos = m.end()

  def common_calls(self, run: str, at: int) -> bool:
    """Whether the attribute run `run` (at offset `at`) names computations
    only as `calls=%c` (or to_apply, condition, body); if so, records them.

    Split as `attributes.split_attributes` splits it: a key inside a value
    (a string holding ", calls=%c") is none.
    """
    refs = []
    for whole, key, value in _ATTRIBUTES(run):
      if key in _STRUCTURAL_SET:
        if key not in _SIMPLE_ROLES or value[:1] != "%":
          return False  # (`fast_instruction` reads lists, bare names, predecessors)
        # A value starting with '%' is `%name` (attributes.VALUE); the ref
        # points at the '%', after the key's '=' (the first: names hold none).
        refs.append((value[1:], at + whole.index("=") + 1))
      at += len(whole)
    self.refs += refs
    return True

  def fast_instruction(self, comp: _Comp, m: re.Match) -> bool:
    """Builds the instruction `_FAST_LINE` matched, if nothing in it needs the
    slow path. Returns False, having changed nothing, otherwise.

    This is the hot loop of parsing a dump: keep it free of avoidable calls.
    """
    root_kw, pct, name, shape_text, word, ops, run, _ = m.groups()
    # (`_FAST_LINE` takes no name starting with "__" that XLA renames.) A
    # `%` name may be a keyword, but not an element type: XLA renames `%s32`.
    if not pct and (name in _RESERVED or m.string[m.end(3)] == "=") or name in _TYPE_NAMES:
      return False
    names = comp.names
    if name in names or (root_kw and comp.root_name is not None):
      return False
    resolved = _RESOLVE.get(word)
    if resolved is None:
      return False
    opcode, wrapped = resolved
    if wrapped is not None and opcode == "async-start":
      return False  # builds a wrapped computation: the slow path does that
    shape = self.shapes.get(shape_text)
    if shape is None:
      shape = self.shape(shape_text)
      if shape is None:
        return False
    preds: tuple[str, ...] = ()
    refs: list[tuple[str, int]] = []
    attrs: Mapping[str, str] | str = run or _EMPTY_ATTRS
    if run and _STRUCTURAL_KEY.search(run) is not None:
      # Split now: called computations must exist, control predecessors too.
      split = {}
      where = {}
      for a in attributes.ATTRIBUTE.finditer(run):
        key = a.group(2)
        if key in split:
          return False  # repeated: the slow path reports it
        split[key] = a.group(3)
        where[key] = a.start(3)
      base = m.start(7)
      for key in _STRUCTURAL:
        raw = split.get(key)
        if raw is None:
          continue
        if key == "control-predecessors":
          nm = _SIMPLE_NAMES.fullmatch(raw)
          if nm is None or not nm.group(1):
            return False
          parts = [r.strip() for r in nm.group(1).split(",")]
          if any(r in _RESERVED for r in parts):
            return False
          preds = tuple(r.lstrip("%") for r in parts)
          if any(p not in names for p in preds):
            return False
          del split[key]
        elif key in _LIST_ROLES:
          nm = _SIMPLE_NAMES.fullmatch(raw)
          if nm is None:
            return False
          these = []
          for r in _SIMPLE_REF.finditer(raw):
            if r.group() in _RESERVED:
              return False
            these.append(r.group(1))
            refs.append((r.group(1), base + where[key] + r.start()))
          split[key] = "{" + ", ".join("%" + r for r in these) + "}"
        else:
          rm = _SIMPLE_REF.fullmatch(raw)
          if rm is None or raw in _RESERVED:
            return False
          ref = rm.group(1)
          if raw[0] != "%":
            split[key] = "%" + ref
          refs.append((ref, base + where[key]))
      attrs = MappingProxyType(split)
    elif run:
      keys = _ATTR_KEY.findall(run)
      if len(keys) > 1 and len(set(keys)) != len(keys):
        exact = [key for _, key, _ in attributes.ATTRIBUTE.findall(run)]
        if len(set(exact)) != len(exact):
          return False  # repeated: the slow path reports it
    # Operands.
    literal = None
    param = None
    operands: tuple[str, ...] = ()
    if opcode == "parameter":
      ops = ops.strip()
      # ASCII only ("²".isdigit()), and small enough for the lexer's range.
      if not (ops.isascii() and ops.isdigit()) or len(ops) > 18:
        return False
      param = int(ops)
    elif opcode == "constant":
      literal = ops.strip()
      if not literal or not _fast_literal(literal):
        return False
    elif ops:
      # Common form "%a, %b": one findall, a rebuild to compare, a set check.
      out = _PERCENT_NAMES.findall(ops)
      if (out and ops == "%" + ", %".join(out) and
          all(map(names.__contains__, out))):
        operands = tuple(out)
      else:
        operands = self.general_operands(ops, names)
        if operands is None:
          return False
    arity = _ARITY.get(opcode)
    if arity is not None and arity != len(operands):
      return False
    at = m.start(2)
    self.refs += refs
    if root_kw:
      comp.root_name = name
    self.pending_names.append(name)
    inst = _make_instruction(name, opcode, shape, operands, attrs, preds,
                             literal, param, wrapped, at, self.ctx)
    names[name] = inst
    return True

  def general_operands(self, ops: str, names: dict) -> tuple[str, ...] | None:
    """Operands written with types, comments or odd spacing; None if the slow
    path must look."""
    if "/*" in ops:
      ops = _COMMENT.sub("", ops)
    if ops.isspace() or not ops:
      return ()
    if "%" in ops:
      # Typed operands as XLA prints them without `print_operand_shape=false`
      # (flax modules): `f32[2,3]{1,0} %a, s32[] %b`; shapes hold commas.
      out = []
      pos, n = 0, len(ops)
      while pos < n:
        t = _TYPED_OPERAND.match(ops, pos)
        if t is None or t.end() == pos:
          break
        typed, op = t.groups()
        if typed is not None and self.shape(typed) is None:
          return None
        if op not in names:
          return None
        out.append(op)
        pos = t.end()
      else:
        if ops.rstrip()[-1:] != ",":
          return tuple(out)
    out = []
    for op in ops.split(","):
      op = op.strip()
      if op[:1] == "%":
        op = op[1:]
      elif " " in op:
        typed, op = op.rsplit(" ", 1)
        if self.shape(typed.strip()) is None:
          return None
        if op[:1] == "%":
          op = op[1:]
        elif op in _RESERVED:
          return None
      elif op in _RESERVED:
        return None
      if op not in names:
        return None
      out.append(op)
    return tuple(out)

  def shape(self, text: str) -> Shape | None:
    """The shape written `text` (memoized), or None if it is not one."""
    shape = self.shapes.get(text)
    if shape is None:
      if text[:1] == "(" and text[-1:] == ")" and len(text) > 2:
        shape = self.flat_tuple_shape(text)
        if shape is not None:
          self.shapes[text] = shape
          return shape
      shape = _plain_array_shape(text)
      if shape is None:
        try:
          shape = parse_shape(text)
        except HloParseError:
          return None
      self.shapes[text] = shape
    return shape

  def flat_tuple_shape(self, text: str) -> Shape | None:
    """A tuple of array shapes from its (memoized) elements, or None to let
    the lexer read it. Long while-loop and fusion tuples repeat the same
    few element shapes hundreds of times; lexing each costs more than the
    rest of their line."""
    elements = []
    pos, end = 1, len(text) - 1
    match = _TUPLE_ELEMENT.match
    shapes = self.shapes
    while pos < end:
      m = match(text, pos, end)
      if m is None or (pos > 1) != (text[pos] == ","):
        return None
      element = m.group(1)
      shape = shapes.get(element)
      if shape is None:
        try:
          shape = parse_shape(element)
        except HloParseError:
          return None
        shapes[element] = shape
      elements.append(shape)
      pos = m.end()
    return Shape("tuple", tuple_shapes=tuple(elements))

  # ------------------------------------------------------------ slow path --

  def parse_instruction(self, comp: _Comp) -> None:
    """instruction ::= ('ROOT')? name '=' rhs."""
    lx = self.lx
    is_root = False
    root_at = lx.tok.start
    if lx.tok.kind is Tok.KEYWORD and lx.tok.value == "ROOT":
      is_root = True
      lx.lex()
    tok = lx.tok
    if tok.kind not in (Tok.NAME, Tok.IDENT):
      lx.error(f"expected an instruction name, found {grammar.describe(tok)}")
    lx.lex()
    grammar.expect(lx, Tok.EQUAL, "expected '=' after the instruction name")
    if is_root:
      if comp.root_name is not None:
        self.error(root_at, "a computation can have only one ROOT")
      comp.root_name = tok.value  # type: ignore[assignment]
    self.parse_instruction_rhs(comp, tok.value, tok.start, True)  # type: ignore[arg-type]

  def parse_instruction_rhs(self, comp: _Comp, name: str, name_at: int,
                            allow_attributes: bool, depth: int = 0) -> Instruction:
    """rhs ::= shape? opcode operands attributes."""
    lx = self.lx
    if depth > grammar.MAX_DEPTH:
      lx.error("instructions nested too deeply")
    shape = grammar.parse_shape(lx) if grammar.can_be_shape(lx) else None
    tok = lx.tok
    if tok.kind is not Tok.IDENT:
      lx.error(f"expected an opcode, found {grammar.describe(tok)}")
    resolved = opcodes.resolve(tok.value)  # type: ignore[arg-type]
    if resolved is None:
      lx.error(f"unknown opcode {tok.value!r}")
    opcode, wrapped = resolved
    lx.lex()
    if shape is None and opcode not in opcodes.CAN_INFER_SHAPE:
      self.error(tok.start, f"cannot infer the shape of {opcode}: write it before the opcode")
    literal = None
    param = None
    operands: list[str] = []
    if opcode == "parameter":
      grammar.expect(lx, Tok.LPAREN, "expected '(' before the parameter number")
      at = lx.tok.start
      param = grammar.parse_int(lx, "parameter number")
      if param < 0:
        self.error(at, "parameter number must be >= 0")
      grammar.expect(lx, Tok.RPAREN, "expected ')' after the parameter number")
    elif opcode == "constant":
      open_tok = lx.tok
      if open_tok.kind is not Tok.LPAREN:
        lx.error("expected '(' before the constant literal")
      grammar.skip_group(lx)
      literal = self.text[open_tok.end:lx.prev_end - 1].strip()
      if not literal:
        self.error(open_tok.end, "expected a literal")
    else:
      at = lx.tok.start
      operands = self.parse_operands(comp, depth)
      arity = _ARITY.get(opcode)
      if arity is not None and arity != len(operands):
        self.error(at, f"{tok.value} expects {arity} operand"
                   f"{'' if arity == 1 else 's'}, but has {len(operands)}")
    attrs = self.parse_attributes(lx, comp=comp, allow=allow_attributes)
    preds: tuple[str, ...] = ()
    raw_preds = attrs.pop("control-predecessors", None)
    if raw_preds is not None:
      preds = self.check_predecessors(comp, raw_preds, name_at)
    if opcode == "async-start" and wrapped is not None:
      attrs = self.wrap_async(comp, shape, operands, wrapped, attrs, name_at)
    if shape is None:
      shape = shape_inference.infer(
          opcode, [comp.names[o].shape for o in operands], attrs,
          self.computation_root)
    if not name:
      self.flush_pending_names()
      name = self.anon.unique(f"{opcode}.anon")
    else:
      self.pending_names.append(name)
    if sanitize_name(name) != name:
      self.error(name_at, f"illegal instruction name {name!r}; XLA would call it "
                 f"{sanitize_name(name)!r}")
    if name in comp.names:
      self.error(name_at, f"instruction {name} is defined twice in computation "
                 f"{comp.name}")
    inst = Instruction(name, opcode, shape, tuple(operands),
                       types.MappingProxyType(attrs) if attrs else _EMPTY_ATTRS,
                       preds, literal, param, wrapped, name_at, self.ctx)
    comp.names[name] = inst
    return inst

  def flush_pending_names(self) -> None:
    """Registers fast-path names with the anonymous-name uniquifier, in order
    (deferred: only modules with nested instructions ever need it)."""
    for n in self.pending_names:
      self.anon.unique(n)
    self.pending_names.clear()

  def computation_root(self, name: str) -> Shape | None:
    for c in self.done:
      if c.name == name and c.root_name is not None:
        return c.names[c.root_name].shape
    return None

  def check_predecessors(self, comp: _Comp, raw: str, at: int) -> tuple[str, ...]:
    # Lex the value where it sits in the text, so that the lexer's own errors
    # (an integer out of range) point there.
    start = self.text.find(raw, at)
    lx = Lexer(self.text, start, self.source) if start >= 0 else Lexer(raw, 0)
    names = []
    if not grammar.eat(lx, Tok.LBRACE):
      self.error(at, "expected '{' to start control-predecessors")
    while True:
      tok = lx.tok
      if tok.kind not in (Tok.NAME, Tok.IDENT):
        self.error(at, "expected an instruction name in control-predecessors")
      if tok.value not in comp.names:
        self.error(at, f"control predecessor {tok.value} is not defined before it is used")
      names.append(tok.value)
      lx.lex()
      if not grammar.eat(lx, Tok.COMMA):
        break
    if lx.tok.kind is not Tok.RBRACE:
      self.error(at, "expected '}' to end control-predecessors")
    return tuple(names)  # type: ignore[arg-type]

  def wrap_async(self, comp: _Comp, shape: Shape | None, operands: list[str],
                 wrapped: str, attrs: dict[str, str], at: int) -> dict[str, str]:
    """`X-start(...)`: XLA wraps X in a computation of its own."""
    if shape is None or not shape.is_tuple or len(shape.tuple_shapes) < 2 or \
        not shape.tuple_shapes[0].is_tuple:
      self.error(at, "an async start needs a shape ((operands), outputs, state)")
    inner = _Comp(self.placeholder("async_wrapped"), at)
    for i, op in enumerate(operands):
      p = Instruction("async_param" if i == 0 else f"async_param.{i}",
                      "parameter", comp.names[op].shape, (), _EMPTY_ATTRS, (),
                      None, i, None, at, self.ctx)
      inner.names[p.name] = p
    keep = {k: v for k, v in attrs.items()
            if k in ("metadata", "backend_config", "frontend_attributes",
                     "sharding", "statistics", "origin")}
    op_attrs = {k: v for k, v in attrs.items() if k not in ("async_execution_thread",
                                                           "output_to_operand_aliasing")}
    # jaxlib <= 0.10 gives the wrapped op its default name, its opcode (newer
    # XLA names it "async_op"); parity tests hold us to the installed jaxlib.
    root = Instruction(wrapped, wrapped, shape.tuple_shapes[1],
                       tuple(inner.names),
                       types.MappingProxyType(op_attrs) if op_attrs else _EMPTY_ATTRS,
                       (), None, None, None, at, self.ctx)
    inner.names[root.name] = root
    inner.root_name = root.name
    if compat.XLA_ASYNC_START_BINDS_MISSING_PARAMS and wrapped in ("call", "fusion"):
      # A call or fusion start with fewer operands than its computation has
      # parameters ("partially bound"): newer XLA gives the wrapper the rest
      # as parameters. (A reducer's parameters are not operands.)
      for i, shape_i in enumerate(self.unbound_params(attrs, len(operands)),
                                  start=len(operands)):
        p = Instruction("async_param" if i == 0 else f"async_param.{i}", "parameter",
                        shape_i, (), _EMPTY_ATTRS, (), None, i, None, at, self.ctx)
        inner.names[p.name] = p
    self.done.append(inner)
    key = inner.name
    self.pool[key] = at
    out = dict(keep)
    for k in ("async_execution_thread", "output_to_operand_aliasing"):
      if k in attrs:
        out[k] = attrs[k]
    out["calls"] = "%" + key
    return out

  def unbound_params(self, attrs: dict[str, str], bound: int) -> list[Shape]:
    """Shapes of the parameters after the first `bound` of the computation an
    async start calls (`to_apply` or `calls`), when it is already parsed."""
    ref = attrs.get("to_apply", attrs.get("calls", ""))
    name = ref[1:] if ref.startswith("%") else ref
    for c in self.done:
      if c.name == name:
        params = sorted((i for i in c.names.values() if i.opcode == "parameter"),
                        key=lambda i: i.parameter_number)
        return [i.shape for i in params[bound:]]
    return []

  def parse_operands(self, comp: _Comp, depth: int) -> list[str]:
    """operands ::= '(' (operand (',' operand)*)? ')'; operand ::= shape? name
    | nested instruction."""
    lx = self.lx
    grammar.expect(lx, Tok.LPAREN, "expected '(' to start the operands")
    out: list[str] = []
    if lx.tok.kind is Tok.RPAREN:
      lx.lex()
      return out
    dropped: list[tuple[HloParseError, HloParseError]] = []
    while True:
      state = lx.save()
      try:
        out.append(self.parse_named_operand(comp))
      except HloParseError as named_error:
        lx.restore(state)
        if lx.tok.kind is Tok.NAME and self.text.startswith("#", lx.tok.end):
          raise  # `%t#i`: no nested instruction starts this way
        try:
          nested = self.parse_instruction_rhs(comp, "", lx.tok.start, False,
                                              depth=depth + 1)
          out.append(nested.name)
        except HloParseError as nested_error:
          # XLA's ParseOperands records both errors but does not stop: the
          # operand is dropped and parsing goes on from where the nested
          # attempt failed. Modules XLA accepts this way must parse here too.
          dropped.append((nested_error, named_error))
      if not grammar.eat(lx, Tok.COMMA):
        break
    undefined = [named for _, named in dropped if named.message.endswith(_UNDEFINED)]
    if undefined and lx.tok.kind is not Tok.RPAREN:
      # The operand list does not close where the dropped operand left it:
      # an operand that names no instruction is the cause, not the ')'.
      raise undefined[0]
    grammar.expect(lx, Tok.RPAREN, "expected ')' to end the operands")
    for nested_error, named_error in dropped:
      _log.warning("%s; dropping the operand, as XLA's parser does "
                   "(it also failed as a named operand: %s)",
                   nested_error, named_error.message)
    return out

  def parse_named_operand(self, comp: _Comp) -> str:
    lx = self.lx
    shape = grammar.parse_shape(lx) if grammar.can_be_shape(lx) else None
    tok = lx.tok
    if tok.kind not in (Tok.NAME, Tok.IDENT):
      if shape is not None and self.single and self.scopes == 1:
        return self.missing_parameter(comp, "", shape, tok.start)
      lx.error(f"expected an operand name, found {grammar.describe(tok)}")
    name = tok.value
    lx.lex()
    # `%t#1#0`: element 0 of element 1 of t's tuple, as XLA's dumps print a
    # get-tuple-element they leave out.
    path: list[tuple[int, int]] = []
    while lx.tok.kind is Tok.OCTOTHORP:
      lx.lex()
      at = lx.tok.start
      path.append((grammar.parse_int(lx, "a tuple index after '#'"), at))
    if lx.tok.kind not in (Tok.COMMA, Tok.RPAREN):
      lx.error(f"expected ',' or ')' after operand {name}")
    if name not in comp.names:
      if self.single and self.scopes == 1 and shape is not None and not path:
        return self.missing_parameter(comp, name, shape, tok.start)  # type: ignore[arg-type]
      self.error(tok.start, f"operand {name} is not defined" + _UNDEFINED)
    if path:
      return self.tuple_element(comp, name, path)  # type: ignore[arg-type]
    return name  # type: ignore[return-value]

  def tuple_element(self, comp: _Comp, name: str, path: list[tuple[int, int]]) -> str:
    """The get-tuple-element chain `%name#i#j` stands for, made as XLA's
    parser makes it: once per computation and path, right before its first
    reader, named `name_i`, then `name_i_j` (made unique)."""
    made = comp.elements
    source, base = name, name
    for depth, (index, at) in enumerate(path):
      key = (name, tuple(i for i, _ in path[:depth + 1]))
      base = f"{base}_{index}"
      found = made.get(key)
      if found is None:
        shape = comp.names[source].shape
        if shape is None or not shape.is_tuple or not 0 <= index < len(shape.tuple_shapes):
          self.error(at, f"{source} has no tuple element {index}")
        self.flush_pending_names()
        found = made[key] = self.anon.unique(base)
        # No offset: its attributes are not in the text to read back.
        comp.names[found] = Instruction(
            found, "get-tuple-element", shape.tuple_shapes[index], (source,),
            types.MappingProxyType({"index": str(index)}), (), None, None, None, -1,
            self.ctx)
      source = found
    return source

  def missing_parameter(self, comp: _Comp, name: str, shape: Shape, at: int) -> str:
    name = name or f"_{comp.param_count}"
    p = Instruction(name, "parameter", shape, (), _EMPTY_ATTRS, (), None,
                    comp.param_count, None, at, self.ctx)
    comp.param_count += 1
    comp.names[name] = p
    return name

  # -------------------------------------------------------------- assembly --

  def check_refs(self) -> None:
    for name, at in self.refs:
      if name not in self.pool:
        self.error(at, f"computation {name} does not exist")

  def assemble(self, name: str | None, header: dict[str, str],
               stack_frames: StackFrameIndex | None, entry: _Comp) -> HloModule:
    """Applies XLA's module-wide name uniquifier and builds the IR."""
    comp_names = _NameUniquer()
    inst_names = _NameUniquer()
    generated: dict[str, str] = {}
    # Computations named as XLA prints them keep their names: one check for
    # all instead of the uniquifier per computation.
    names = [c.name for c in self.done]
    keep = (not self.generated and _all_clean(names) and
            _uniquifier_is_identity(names))
    for comp in () if keep else self.done:
      old = comp.name
      new = comp_names.unique(self.generated.get(old, old))
      if old in self.generated:
        generated[old] = new
      elif new != old:
        self.renames[old] = new
      comp.name = new
    all_names = list(chain.from_iterable(c.names for c in self.done))
    identity = _uniquifier_is_identity(all_names)
    computations = []
    for comp in self.done:
      local: dict[str, str] = {}
      unique = inst_names.unique
      # The name table holds the instructions in order (names are unique).
      insts = tuple(comp.names.values())
      for inst in () if identity else insts:
        new = unique(inst.name, True)
        if new != inst.name:
          local[inst.name] = new
      root = local.get(comp.root_name, comp.root_name)
      if local or generated:
        computations.append(Computation(
            comp.name, tuple(_rename(i, local, generated) for i in insts), root,
            comp is entry, comp.thread, comp.offset))
      else:
        # The parser's own name table is the computation's index.
        computations.append(_computation(
            comp.name, insts, root, comp is entry, comp.thread,
            comp.offset, types.MappingProxyType(comp.names)))
    if name is None:
      name = "module_" + entry.name
    return HloModule(name, tuple(computations), entry.name,
                     types.MappingProxyType(header), stack_frames, self.ctx)


#: A numeric suffix XLA would rewrite or might see taken: ".0…", signed, or
#: too long for int64. (Anchored at the '.', not the line start: `^(.+)\.`
#: backtracks through every name.)
_NONCANONICAL_SUFFIX = re.compile(r"\.(0\d*|[+-]\d+|\d{19,})$", re.MULTILINE)


def _uniquifier_is_identity(names: list[str]) -> bool:
  """Whether XLA's uniquifier would keep every name as it is.

  It keeps a name unless its (root, numeric suffix) pair was taken before, or
  its suffix is not written canonically (".007" comes back as ".7"). For
  distinct names with canonical suffixes the pairs are distinct; a ".0"
  suffix takes the same pair as the bare root.
  """
  taken = set(names)
  if len(taken) != len(names):
    return False
  joined = "\n".join(names)
  for m in _NONCANONICAL_SUFFIX.finditer(joined):
    # The suffix has no '.', so this is the name's last '.', as in XLA.
    start = joined.rfind("\n", 0, m.start()) + 1
    if start == m.start():
      continue  # no root before the '.'
    root, suffix = joined[start:m.start()], m.group(1)
    if len(suffix.lstrip("+-")) > 18:
      return False
    number = int(suffix)
    if suffix != "0" and str(number) != suffix:
      return False  # ".007" comes back as ".7"
    canonical = root if number == 0 else f"{root}.{number}"
    if canonical in taken:
      return False
    taken.add(canonical)
  return True


def _fast_literal(literal: str) -> bool:
  """Whether the slow path would read `literal` without error (its braces
  balanced and not nested past `grammar.MAX_DEPTH`)."""
  if _FAST_LITERAL.fullmatch(literal) is None:
    return False
  if "{" not in literal and "}" not in literal:
    return True
  depth = 0
  for c in _NOT_BRACE.sub("", literal):
    depth += 1 if c == "{" else -1
    if depth < 0 or depth >= grammar.MAX_DEPTH:
      return False
  return depth == 0


#: Names one per line, each as `_CLEAN` takes it; a line starting with `__`
#: but not `__xla_` (which `_plain_name` rejects).
_CLEAN_LINES = re.compile(r"(?:" + _NAME + r"\n)*+" + _NAME)
_DUNDER_LINE = re.compile(r"^__(?!xla_)", re.MULTILINE)


def _all_clean(names: list[str]) -> bool:
  """Whether `sanitize_name` keeps each of `names` (non-empty) as it is:
  `_CLEAN` and `_plain_name` for all at once (thousands of computations)."""
  joined = "\n".join(names)
  return (_CLEAN_LINES.fullmatch(joined) is not None and
          _DUNDER_LINE.search(joined) is None and
          dtypes.ELEMENT_TYPES.isdisjoint(names))


class _MutableComputation:
  """`Computation`'s slots without the frozen `__setattr__` (see
  `_MutableInstruction`): thousands of small computations in a dump."""

  __slots__ = Computation.__slots__


assert _MutableComputation.__slots__ == ("name", "instructions", "root_name", "is_entry",
                                         "execution_thread", "offset", "_index",
                                         "_parameters", "_op_names")


def _computation(name, instructions, root_name, is_entry, thread, offset,
                 index) -> Computation:
  """`Computation(...)` with its name index given (the parser has built it
  already): a dict per computation saved on modules of thousands."""
  comp = _new(_MutableComputation)
  comp.name = name
  comp.instructions = instructions
  comp.root_name = root_name
  comp.is_entry = is_entry
  comp.execution_thread = thread
  comp.offset = offset
  comp._index = index
  comp._parameters = None
  comp._op_names = None
  comp.__class__ = Computation
  return comp


def _reserved(name: str) -> bool:
  """Names a bare identifier cannot have (keywords, element types)."""
  return name in _RESERVED


class _MutableInstruction:
  """`Instruction`'s slots without the frozen `__setattr__`: the parser fills
  one with plain attribute stores and then makes it an `Instruction`
  (`__class__` assignment; the layouts are identical). Half the cost of the
  frozen dataclass's setters, and a tenth of parsing a large dump: the speed
  target wins over the style of the rest of the IR here."""

  __slots__ = Instruction.__slots__


assert _MutableInstruction.__slots__ == tuple(
    f.name for f in dataclasses.fields(Instruction)), "Instruction's fields changed"
_new = object.__new__


def _make_instruction(name, opcode, shape, operands, attrs, preds, literal,
                      param, wrapped, offset, ctx) -> Instruction:
  """`Instruction(...)`, setting exactly the fields its __init__ sets."""
  inst = _new(_MutableInstruction)
  inst.name = name
  inst.opcode = opcode
  inst.shape = shape
  inst.operands = operands
  inst.attribute_source = attrs
  inst.control_predecessors = preds
  inst.literal = literal
  inst.parameter_number = param
  inst.async_wrapped_opcode = wrapped
  inst.offset = offset
  inst._ctx = ctx
  inst._cache = None
  inst.__class__ = Instruction
  return inst


def _rename(inst: Instruction, local: dict[str, str],
            generated: dict[str, str]) -> Instruction:
  """`inst` with renamed instructions and parser-made computations."""
  src = inst.attribute_source
  if generated and not isinstance(src, str):
    roles = [r for r in COMPUTATION_ROLES if "\0" in src.get(r, "")]
    if roles:
      fixed = dict(src)
      for r in roles:
        fixed[r] = _PLACEHOLDER.sub(lambda m: generated[m.group()], fixed[r])
      src = types.MappingProxyType(fixed)
  if not local and src is inst.attribute_source:
    return inst
  return Instruction(local.get(inst.name, inst.name), inst.opcode, inst.shape,
                     tuple(local.get(o, o) for o in inst.operands), src,
                     tuple(local.get(p, p) for p in inst.control_predecessors),
                     inst.literal, inst.parameter_number,
                     inst.async_wrapped_opcode, inst.offset, inst._ctx)


_PLACEHOLDER = re.compile("\0\\d+\0")
_RESOLVE: dict[str, tuple[str, str | None]] = {}
for _op in opcodes.OPCODES:
  _RESOLVE[_op] = (_op, None)
  for _suffix, _async in (("-start", "async-start"), ("-update", "async-update"),
                          ("-done", "async-done")):
    if _op + _suffix not in opcodes.OPCODES:
      _RESOLVE[_op + _suffix] = (_async, _op)


# ------------------------------------------------------------------ public --


def parse_hlo(text: str, *, source: str | None = None) -> HloModule:
  """Parses HLO text (a module, a computation list, or one instruction).

  Accepts everything XLA's `ParseAndReturnUnverifiedModule` accepts: CPU, GPU
  and TPU dumps, scheduled modules, async pairs, comments, elided constants.
  Names are uniquified module-wide exactly as XLA does.

  Args:
    text: the HLO text.
    source: file name to show in error messages.

  Returns:
    The module.

  Raises:
    HloParseError: with line, column and the offending text; no other
      exception escapes for malformed input.
  """
  if not isinstance(text, str):
    raise TypeError(f"parse_hlo expects str, got {type(text).__name__}")
  return _parse(text, source, fast=True)


def _parse(text: str, source: str | None, fast: bool) -> HloModule:
  parser = _Parser(text, source, fast)
  try:
    with paused_gc():  # the IR has no cycles: a tenth of the parse saved
      return parser.parse()
  except RecursionError:
    error_at(text, parser.lx.tok.start if parser.lx else 0,
             "input nested too deeply", source)


def parse_hlo_file(path: str | os.PathLike) -> HloModule:
  """Reads and parses an HLO text file (see `parse_hlo`).

  Raises:
    HloParseError: for malformed text, naming the file.
    OSError: if the file cannot be read.
  """
  path = os.fspath(path)
  with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
    text = f.read()
  return parse_hlo(text, source=path)


def parse_shape(text: str) -> Shape:
  """Parses one shape, e.g. "f32[8,128]{1,0}" or "(s32[], bf16[2])".

  Raises:
    HloParseError: if `text` is not exactly one shape.
  """
  lx = Lexer(text, 0)
  shape = grammar.parse_shape(lx)
  if lx.tok.kind is not Tok.EOF:
    lx.error(f"unexpected {grammar.describe(lx.tok)} after the shape")
  return shape

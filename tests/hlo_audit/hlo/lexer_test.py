"""The HLO lexer: token kinds, values and offsets; comments; errors with
line and column."""

from __future__ import annotations

import math
import pickle

import pytest

from hlo_audit import HloParseError
from hlo_audit._src.hlo.lexer import Lexer, Tok, line_col, unescape


def tokens(text: str) -> list[tuple[str, int, int, object]]:
  lx = Lexer(text)
  out = []
  while lx.tok.kind is not Tok.EOF:
    out.append((lx.tok.kind.name, lx.tok.start, lx.tok.end, lx.tok.value))
    lx.lex()
  return out


def test_instruction_line():
  assert tokens("%add.1 = f32[2]{0} add(x, %y)") == [
      ("NAME", 0, 6, "add.1"),
      ("EQUAL", 7, 8, "="),
      ("PRIMITIVE_TYPE", 9, 12, "f32"),
      ("LSQUARE", 12, 13, "["),
      ("INT", 13, 14, 2),
      ("RSQUARE", 14, 15, "]"),
      ("LBRACE", 15, 16, "{"),
      ("INT", 16, 17, 0),
      ("RBRACE", 17, 18, "}"),
      ("IDENT", 19, 22, "add"),
      ("LPAREN", 22, 23, "("),
      ("IDENT", 23, 24, "x"),
      ("COMMA", 24, 25, ","),
      ("NAME", 26, 28, "y"),
      ("RPAREN", 28, 29, ")"),
  ]


def test_name_colon_and_attribute_name_equals_are_one_token():
  """`x:` (parameter lists) and `k=` (attributes) fold the punctuation in,
  as XLA's lexer does; with a space between they do not."""
  assert tokens("x: k=") == [("NAME", 0, 2, "x"), ("ATTRIBUTE_NAME", 3, 5, "k")]
  assert tokens("k =") == [("IDENT", 0, 1, "k"), ("EQUAL", 2, 3, "=")]


@pytest.mark.parametrize("text, kind, value", [
    ("b01f_01io->b01f", "DIM_LABELS", "b01f_01io->b01f"),
    ("bf_io->bf", "DIM_LABELS", "bf_io->bf"),
    ("0_1x2_3_1", "PAD", "0_1x2_3_1"),
    ("-1_-2", "PAD", "-1_-2"),
    ("3x3", "DXD", "3x3"),
    ("1.5", "DECIMAL", 1.5),
    ("1e10", "DECIMAL", 1e10),
    ("-2.5e-3", "DECIMAL", -2.5e-3),
    ("7.", "DECIMAL", 7.0),
    ("-2", "INT", -2),
    ("18446744073709551615", "INT", 18446744073709551615),  # uint64 max
    ("-9223372036854775808", "INT", -9223372036854775808),  # int64 min
    ("-inf", "NEG_INF", -math.inf),
    ("inf", "KEYWORD", "inf"),
    ("true", "KEYWORD", "true"),
    ("ENTRY", "KEYWORD", "ENTRY"),
    ("f8e4m3fn", "PRIMITIVE_TYPE", "f8e4m3fn"),
    ("f32x", "IDENT", "f32x"),
    ("get-tuple-element", "IDENT", "get-tuple-element"),
    ("...", "DOTS", "..."),
    ("?", "QUESTION", "?"),
    ("<=", "LEQ", "<="),
    ("->", "ARROW", "->"),
])
def test_single_tokens(text, kind, value):
  ((k, start, end, v),) = tokens(text)
  assert (k, start, end, v) == (kind, 0, len(text), value)


@pytest.mark.parametrize("text", ["nan", "-nan", "nan(0x7fc00001)", "-nan(0x1)"])
def test_nan_with_and_without_payload(text):
  ((kind, start, end, value),) = tokens(text)
  assert (kind, start, end) == ("DECIMAL", 0, len(text))
  assert math.isnan(value)


def test_strings_are_unescaped():
  assert tokens(r'"a\n\"b\\" ' + "'c'") == [
      ("STRING", 0, 10, 'a\n"b\\'), ("STRING", 11, 14, "c")]


@pytest.mark.parametrize("body, decoded", [
    (r"plain", "plain"),
    (r"tab\there", "tab\there"),
    (r"\x41\102", "AB"),  # hex and octal
    (r"q\"q", 'q"q'),
    (r"back\\slash", "back\\slash"),
    (r"a\qb", "aqb"),  # an escape C does not name: the character itself
])
def test_unescape(body, decoded):
  assert unescape(body) == decoded


def test_comments_are_skipped():
  text = "a /* block\n comment */ b // line comment\n c"
  assert [t[3] for t in tokens(text)] == ["a", "b", "c"]
  assert tokens("x/*index=5*/y")[1][1] == len("x/*index=5*/")


def test_save_restore_and_peek():
  lx = Lexer("a b c")
  state = lx.save()
  assert lx.peek().value == "b"
  assert lx.tok.value == "a"  # peek does not move
  lx.lex()
  lx.lex()
  assert lx.tok.value == "c"
  lx.restore(state)
  assert lx.tok.value == "a"


@pytest.mark.parametrize("text, line, column, message", [
    ('ok\n  "never closed', 2, 3, "unterminated string"),
    ("a /* open", 1, 3, "unterminated /* comment"),
    ("a\n b\n   @", 3, 4, "unexpected character '@'"),
    ("18446744073709551616", 1, 1, "integer out of range"),
    ("x -9223372036854775809", 1, 3, "integer out of range"),
    ("% x", 1, 1, "expected a name after '%'"),
    ("nan(12)", 1, 4, "invalid NaN payload"),
    ("- 1", 1, 1, "invalid number or pattern"),
])
def test_errors_carry_line_and_column(text, line, column, message):
  with pytest.raises(HloParseError) as e:
    tokens(text)
  assert (e.value.line, e.value.column, e.value.message) == (line, column, message)


def test_error_text_shows_the_line_and_a_caret():
  with pytest.raises(HloParseError) as e:
    tokens("first\nsecond @ line\nthird")
  err = e.value
  assert err.line_text == "second @ line"
  assert str(err) == "2:8: unexpected character '@'\nsecond @ line\n       ^"
  assert isinstance(err, ValueError)


def test_line_col_counts_newlines_and_drops_carriage_returns():
  text = "ab\r\ncd\r\nef"
  assert line_col(text, 0) == (1, 1, "ab")
  assert line_col(text, 5) == (2, 2, "cd")
  assert line_col(text, len(text)) == (3, 3, "ef")
  # Bare CR does not break lines (as in XLA).
  assert line_col("a\rb", 2) == (1, 3, "a\rb")


def test_parse_error_pickles_with_its_fields():
  """Errors cross process boundaries (worker pools) intact."""
  with pytest.raises(HloParseError) as e:
    tokens("ok\n @")
  back = pickle.loads(pickle.dumps(e.value))
  assert (back.line, back.column, back.line_text, back.message) == (2, 2, " @", "unexpected character '@'")
  assert str(back) == str(e.value)


def test_brace_scan_in_one_match_ends_where_the_chunk_scan_ends():
  """`scan_braces` reads a group in one regular expression match when it
  can; wherever that match succeeds, the chunk-by-chunk scan (strings and
  comments skipped) must end at the same offset, and where the chunk scan
  fails, the match must too."""
  import random

  from hlo_audit._src.hlo import grammar

  def chunks(text):
    try:
      return grammar.scan_brace_chunks(Lexer(text), 0)
    except HloParseError:
      return None

  rng = random.Random(14)
  alphabet = ["{", "}", "{", "}", '"', "/", "*", "\\", "\n", "\r", "a", " ", "//", "/*", "*/"]
  matched = 0
  for _ in range(20000):
    text = "{" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) + "}x"
    m = grammar._PLAIN_BRACES.match(text)
    if m is not None:
      matched += 1
      assert m.end() == chunks(text), text
  assert matched > 2000  # the comparison ran on many groups, nested and not
  nested = "{" * 8 + "}" * 8
  assert grammar.scan_braces(Lexer(nested + "x"), 0) == len(nested)
  deeper = "{" * 9 + '"}" /* } */' + "}" * 9
  assert grammar._PLAIN_BRACES.match(deeper) is None  # the chunk scan takes it
  assert grammar.scan_braces(Lexer(deeper), 0) == len(deeper)

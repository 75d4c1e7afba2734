"""Property-based test: mutated modules never make the parser raise anything
but `HloParseError`.

Base modules are a fixed sample of small corpus modules (or, when the
corpus is absent, the built-in snippets); hypothesis truncates them, deletes
and duplicates spans, and inserts stray brackets, quotes, comment markers,
NUL bytes, huge numbers and non-ASCII characters. For each mutated text:

* `parse_hlo` returns a module or raises `HloParseError` whose line, column
  and line text point into the text;
* a returned module's `decode_all()` succeeds or raises `HloParseError`;
* the fast and slow paths agree on accepting it, and on the module.
"""

from __future__ import annotations

import os

import hlo_snippets
import pytest
from hlo_corpus import Corpus, corpus_missing_reason, corpus_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_audit import HloParseError, parse_hlo
from hlo_audit._src.hlo.parser import _parse

#: Texts a mutation inserts or writes over a span with.
STRAY = ["(", ")", "{", "}", "[", "]", '"', "'", "\0", "/*", "*/", "//", ",", "=",
         "%", "<=", "->", ":", "\n", "\r", "\r\n", "ROOT ", "ENTRY ", "-", "?", ".",
         "...", "{...}", "e", "T(", "S(", "E(", "0", "-1", "nan", "-inf",
         "99999999999999999999999", "\u00b2", "\u0661", "\u00e9", "\\", "\t",
         "f32[]", "(f32[], s32[])", "calls=", "metadata={", "/*index=5*/"]

#: What inserts draw from: the texts above, or any short text.
INSERTS = st.one_of(st.sampled_from(STRAY), st.text(min_size=1, max_size=3))

#: Mutations, truncation (which loses the most) the least often.
OPS = ["delete", "duplicate", "insert", "overwrite"] * 3 + ["truncate"]

#: Modules of at most this many bytes make the sample (keeps examples fast).
MAX_BASE_BYTES = 6000
SAMPLE_SIZE = 60


def fuzz_bases() -> list[str]:
  """A fixed sample of small corpus modules, or the snippets."""
  if corpus_missing_reason():
    return list(hlo_snippets.ALL.values())
  corpus = Corpus(corpus_path())
  small = [m for m in corpus.spread_sample(2000)
           if m.xla_parses and os.path.getsize(m.path) <= MAX_BASE_BYTES]
  step = max(1, len(small) // SAMPLE_SIZE)
  return [m.read() for m in small[::step][:SAMPLE_SIZE]] + list(hlo_snippets.ALL.values())


BASES = fuzz_bases()


@st.composite
def mutated_modules(draw) -> str:
  text = draw(st.sampled_from(BASES))
  for _ in range(draw(st.integers(1, 6))):
    n = len(text)
    i = draw(st.integers(0, n))
    j = min(n, i + draw(st.sampled_from([1, 2, 5, 20, 200])))
    op = draw(st.sampled_from(OPS))
    if op == "truncate":
      text = text[:i]
    elif op == "delete":
      text = text[:i] + text[j:]
    elif op == "duplicate":
      text = text[:j] + text[i:j] + text[j:]
    elif op == "insert":
      text = text[:i] + draw(INSERTS) * draw(st.integers(1, 3)) + text[i:]
    else:
      text = text[:i] + draw(INSERTS) + text[j:]
  return text


def check_error(text: str, e: HloParseError) -> None:
  """The error's line, column and line text are where it says in `text`."""
  lines = text.split("\n")
  assert 1 <= e.line <= len(lines), e
  assert e.line_text == lines[e.line - 1].rstrip("\r"), e
  assert 1 <= e.column <= len(lines[e.line - 1]) + 1, e


def outcome(text: str, fast: bool):
  """The module, or the HloParseError; anything else propagates."""
  try:
    module = _parse(text, None, fast)
  except HloParseError as e:
    check_error(text, e)
    return e
  try:
    module.decode_all()
  except HloParseError as e:
    check_error(text, e)
  return module


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_modules())
def test_mutated_modules_raise_only_parse_errors(text):
  fast = outcome(text, fast=True)
  slow = outcome(text, fast=False)
  assert isinstance(fast, HloParseError) == isinstance(slow, HloParseError), (fast, slow)
  if not isinstance(fast, HloParseError):
    assert fast == slow


@pytest.mark.parametrize("text", [
    "\0",
    "HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(0)\0\n}\n",
    "HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(\u00b2)\n}\n",
    "HloModule m\nENTRY e {\n  ROOT p = f32[] parameter(0), metadata={op_name=\"\u00e9\\\n\"}\n}\n",
    '"',
    "/*",
    "ENTRY",
    "HloModule",
    "}" * 10,
    "x = f32[] parameter(0), backend_config={" + "[" * 3000 + "}",
])
def test_known_hostile_inputs(text):
  """Inputs found by fuzzing (and their neighbours) keep to the promise."""
  try:
    m = parse_hlo(text)
  except HloParseError as e:
    check_error(text, e)
    return
  try:
    m.decode_all()
  except HloParseError as e:
    check_error(text, e)


def test_fuzz_bases_parse():
  """The unmutated bases parse (so mutations start from valid modules)."""
  for text in BASES:
    parse_hlo(text)

"""Parity with XLA's parser over the third-party corpus (9,473 modules).

* Every module XLA accepts (9,181) parses, every typed attribute decodes,
  and the computation and instruction counts match INDEX.tsv (made with
  jaxlib 0.10.2: checked only where that jaxlib is installed).
* Names and opcodes of every computation and instruction match what the
  installed XLA's parser reports live (jaxlib, via xla_reference.py), for all
  of them but the one tagged `xla_memory_error`; modules a newer XLA has come
  to reject are held to what rejected modules are held to.
* Modules XLA rejects (292) either parse or raise HloParseError.
* The fast and slow parser paths agree on a spread sample of ~2,000.

Each check is one test that lists every mismatch (file, then the first
differing computation, instruction and opcode) with counts.
"""

from __future__ import annotations

import pytest
from hlo_corpus import INDEX_JAXLIB, Corpus

import hlo_audit
from hlo_audit import HloParseError
from hlo_audit._src import compat
from hlo_audit._src.hlo.parser import _parse

pytestmark = pytest.mark.corpus

#: Mismatches listed in a failure message (all are counted).
SHOWN = 40
#: Modules INDEX.tsv's jaxlib accepted that a newer XLA may reject (jaxlib
#: 0.11-0.12 reject 3, whose iota tile assignments do not match their tiles);
#: more means the reference run went wrong, not that XLA got stricter.
MAX_NEWLY_REJECTED = 10

needs_index_jaxlib = pytest.mark.skipif(
    compat.JAXLIB_VERSION_TEXT != INDEX_JAXLIB,
    reason=f"INDEX.tsv's counts are jaxlib {INDEX_JAXLIB}'s; this is jaxlib "
    f"{compat.JAXLIB_VERSION_TEXT} (test_accepted_modules_match_xla_live "
    "compares with it live)")


def structure(module) -> list:
  """[[computation, [[instruction, opcode], ...]], ...], as xla_reference."""
  return [[c.name, [[i.name, i.opcode] for i in c.instructions]]
          for c in module.computations]


def first_difference(ours: list, xla: list) -> str:
  """The first (computation, instruction, opcode) where `ours` and `xla`
  differ, in words."""
  for k, (oc, xc) in enumerate(zip(ours, xla)):
    if oc[0] != xc[0]:
      return f"computation #{k}: ours {oc[0]!r}, XLA {xc[0]!r}"
    for j, (oi, xi) in enumerate(zip(oc[1], xc[1])):
      if oi != xi:
        return (f"computation {oc[0]!r}, instruction #{j}: ours {oi[0]!r} "
                f"({oi[1]}), XLA {xi[0]!r} ({xi[1]})")
    if len(oc[1]) != len(xc[1]):
      return (f"computation {oc[0]!r}: ours has {len(oc[1])} instructions, "
              f"XLA {len(xc[1])}")
  return f"ours has {len(ours)} computations, XLA {len(xla)}"


def report(what: str, total: int, mismatches: list[str]) -> str:
  shown = "\n".join(mismatches[:SHOWN])
  more = f"\n... and {len(mismatches) - SHOWN} more" if len(mismatches) > SHOWN else ""
  return f"{len(mismatches)} of {total} {what}:\n{shown}{more}"


@pytest.fixture(scope="session")
def our_accepted(corpus: Corpus) -> dict[str, list | str]:
  """path -> our structure of each module XLA accepts, or why we failed.

  Every typed attribute is decoded too (`decode_all`): XLA accepted the
  text, so decoding must not fail either; and the `op_name` shortcut must
  agree with the decoded metadata.
  """
  out: dict[str, list | str] = {}
  for m in corpus.accepted:
    try:
      module = hlo_audit.parse_hlo_file(m.path)
      module.decode_all()
      odd = [i.name for _, i in module.instructions() if i.op_name != i.metadata.op_name]
      out[m.path] = (f"op_name differs from metadata.op_name for {odd[:3]}" if odd
                     else structure(module))
    except HloParseError as e:
      out[m.path] = f"HloParseError: {e.message} at {e.line}:{e.column}"
    except Exception as e:  # noqa: BLE001 - reported as a mismatch
      out[m.path] = f"{type(e).__name__}: {e}"
  return out


def test_corpus_is_complete(corpus: Corpus):
  """The corpus is the one the README describes."""
  assert len(corpus.modules) == 9473
  assert len(corpus.accepted) == 9181
  assert len(corpus.rejected) == 292


@needs_index_jaxlib
def test_accepted_modules_parse_with_xla_counts(corpus: Corpus, our_accepted):
  """All 9,181 modules XLA accepts parse and decode, with XLA's computation
  and instruction counts (INDEX.tsv, jaxlib 0.10.2's)."""
  mismatches = []
  for m in corpus.accepted:
    ours = our_accepted[m.path]
    if isinstance(ours, str):
      mismatches.append(f"{m.file}: {ours}")
      continue
    counts = (len(ours), sum(len(insts) for _, insts in ours))
    if counts != (m.xla_computations, m.xla_instructions):
      mismatches.append(f"{m.file}: ours {counts[0]} computations, {counts[1]} "
                        f"instructions; XLA {m.xla_computations}, {m.xla_instructions}")
  assert not mismatches, report("modules XLA accepts differ from INDEX.tsv",
                                len(corpus.accepted), mismatches)


def test_accepted_modules_match_xla_live(corpus: Corpus, our_accepted, xla_corpus_results,
                                        record_property):
  """Names and opcodes of every computation and instruction, in order, are
  the installed XLA's own (jaxlib's parser, run now)."""
  live = [m for m in corpus.accepted if "xla_memory_error" not in m.tags]
  assert len(live) == 9180
  assert set(xla_corpus_results) == {m.path for m in live}
  mismatches, newly_rejected = [], []
  for m in live:
    xla = xla_corpus_results[m.path]
    ours = our_accepted[m.path]
    if xla.get("crashed"):
      mismatches.append(f"{m.file}: {xla['error']}")
    elif not xla["ok"]:
      newly_rejected.append(f"{m.file}: {xla.get('error')}")
      if isinstance(ours, str) and not ours.startswith("HloParseError"):
        mismatches.append(f"{m.file}: XLA rejects it now, and ours raised {ours}")
    elif isinstance(ours, str):
      mismatches.append(f"{m.file}: {ours}")
    elif ours != xla["computations"]:
      mismatches.append(f"{m.file}: {first_difference(ours, xla['computations'])}")
  assert not mismatches, report("modules differ from XLA", len(live), mismatches)
  if compat.JAXLIB_VERSION_TEXT == INDEX_JAXLIB:
    assert not newly_rejected, report("modules INDEX.tsv's jaxlib accepted are rejected "
                                      "by the same jaxlib now", len(live), newly_rejected)
  assert len(newly_rejected) <= MAX_NEWLY_REJECTED, report(
      f"modules jaxlib {INDEX_JAXLIB} accepted are rejected by jaxlib "
      f"{compat.JAXLIB_VERSION_TEXT}", len(live), newly_rejected)
  record_property("rejected_by_this_jaxlib", newly_rejected)


def test_rejected_modules_raise_only_parse_errors(corpus: Corpus, record_property):
  """The 292 modules XLA rejects parse or raise HloParseError; nothing else
  escapes, from parsing or decoding."""
  escaped = []
  outcomes = {"parsed": 0, "HloParseError": 0}
  for m in corpus.rejected:
    try:
      module = hlo_audit.parse_hlo_file(m.path)
    except HloParseError as e:
      assert e.source == m.path and e.line >= 1 and e.column >= 1
      outcomes["HloParseError"] += 1
      continue
    except Exception as e:  # noqa: BLE001 - the failure being tested for
      escaped.append(f"{m.file}: parse raised {type(e).__name__}: {e}")
      continue
    outcomes["parsed"] += 1
    try:
      module.decode_all()
    except HloParseError:
      pass
    except Exception as e:  # noqa: BLE001
      escaped.append(f"{m.file}: decode_all raised {type(e).__name__}: {e}")
  assert not escaped, report("rejected modules raised something else", len(corpus.rejected), escaped)
  # Many are rejected by XLA's verifier or for attributes an opcode does not
  # take, which our parser does not check.
  record_property("rejected_outcomes", outcomes)
  assert sum(outcomes.values()) == len(corpus.rejected)


def test_fast_and_slow_paths_agree(corpus: Corpus):
  """`_parse(fast=True) == _parse(fast=False)` on ~2,000 modules spread over
  every folder (rejected ones included: then both raise the same error)."""
  sample = corpus.spread_sample(2000)
  assert len(sample) >= 1900
  assert {m.folder for m in sample} == {m.folder for m in corpus.modules}
  mismatches = []
  for m in sample:
    text = m.read()
    results = []
    for fast in (True, False):
      try:
        results.append(_parse(text, m.path, fast))
      except HloParseError as e:
        results.append((e.line, e.column, e.message))
    if results[0] != results[1]:
      if isinstance(results[0], tuple) or isinstance(results[1], tuple):
        detail = f"fast {results[0]!r:.200}, slow {results[1]!r:.200}"
      else:
        detail = first_difference(structure(results[0]), structure(results[1])).replace(
            "ours", "fast").replace("XLA", "slow")
      mismatches.append(f"{m.file}: {detail}")
  assert not mismatches, report("modules parse differently on the two paths",
                                len(sample), mismatches)


@pytest.mark.parametrize("tag", ["crlf", "cr_only_eol"])
def test_odd_line_endings(corpus: Corpus, tag):
  """The CRLF module and the CR-only one parse like their LF versions."""
  (m,) = [m for m in corpus.modules if tag in m.tags]
  text = m.read()
  assert ("\r\n" in text) if tag == "crlf" else ("\r" in text and "\n" not in text.rstrip("\n"))
  lf = text.replace("\r\n", "\n").replace("\r", "\n")
  assert hlo_audit.parse_hlo(text) == hlo_audit.parse_hlo(lf)

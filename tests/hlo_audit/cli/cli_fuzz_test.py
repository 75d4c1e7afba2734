"""The CLI under random flags and files: whatever comes in, the exit code is
0, 1 (findings of a --fail-on class) or 2 (bad usage or input), there is
never a traceback, a usage or input error is one line on stderr, and no
control character from the input reaches the output."""

from __future__ import annotations

import contextlib
import io
import json
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hlo_audit._src.cli.main import run

HLO = """HloModule m, is_scheduled=true
ENTRY %main (x: f32[64,64], w: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[64,64]{1,0} parameter(1)
  %d = f32[64,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %c = f32[64,64]{0,1} copy(%d)
  ROOT %t = f32[64,64]{1,0} tanh(%c)
}
"""

# A value a careless or hostile user might give a flag: numbers of any sign,
# sizes and times with odd units, words, and text with control characters.
_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                max_size=12)
_WORDS = st.sampled_from([
    "0", "-1", "-3", "1", "3", "15", "1e9", "nan", "inf", "-inf", "1MiB", "0B", "-5MiB",
    "5us", "1.5ms", "-2s", "bytes", "time", "peak", "bogus", "h200", "cpu", "x" * 300,
    "standalone-copy", "unfused-epilogue,bogus", "donate=0", "donate=params;remat=x",
    "fuse=1", "fuse=0", "fuse=99", "drop=", "=", ";;", "unsplit=a", "[", "\x1b[2J",
    "a\rb", "\x07", "<img src=x>", "{b//0}", "%s%n", "\u202e", "m", "^m$", "(", "0"])
_VALUE = st.one_of(_WORDS, _TEXT)

_FILE_FLAGS = {
    "--top": _VALUE, "--width": _VALUE, "--sort": _VALUE, "--fail-on": _VALUE,
    "--min-bytes": _VALUE, "--min-time": _VALUE, "--what-if": _VALUE,
    "--module": _VALUE, "--device": _VALUE,
}
_SWITCHES = ["--json", "--markdown", "--all", "--list"]


@st.composite
def file_argv(draw):
  argv = []
  for flag in draw(st.lists(st.sampled_from(sorted(_FILE_FLAGS)), max_size=3, unique=True)):
    argv += [flag, draw(_FILE_FLAGS[flag])]
  argv += draw(st.lists(st.sampled_from(_SWITCHES), max_size=2, unique=True))
  return argv


def _run(argv: list[str]) -> tuple[int, str, str]:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = run(argv)
    except SystemExit as e:  # pragma: no cover - run() returns, never exits
      pytest.fail(f"run({argv!r}) exited: {e}")
  return int(code), out.getvalue(), err.getvalue()


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _check(argv, code, out, err):
  assert code in (0, 1, 2), (argv, code, err)
  assert "Traceback" not in err and "Traceback" not in out, (argv, err)
  if code == 2:
    assert err.count("\n") == 1 and not out.strip() or "--list" in argv, (argv, out, err)
  assert not _CONTROL.search(err), (argv, err)
  if "--json" not in argv:  # JSON carries the input's text escaped by JSON itself
    assert not _CONTROL.search(out), (argv, out)
  else:
    if code != 2 and out:
      json.loads(out)


_SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@pytest.fixture(scope="module")
def hlo_file(tmp_path_factory):
  p = tmp_path_factory.mktemp("fuzz") / "m.hlo"
  p.write_text(HLO)
  return str(p)


@_SETTINGS
@given(argv=file_argv())
def test_file_flags(hlo_file, argv):
  argv = ["file", hlo_file, *argv]
  _check(argv, *_run(argv))


# HLO text with a few bytes changed, inserted or cut: most of it parses up to
# the damage, so the parser's error paths (not only its first line) are hit.
@st.composite
def damaged_hlo(draw):
  data = bytearray(HLO.encode())
  for _ in range(draw(st.integers(1, 4))):
    at = draw(st.integers(0, len(data)))
    what = draw(st.sampled_from(["insert", "replace", "cut"]))
    junk = draw(st.binary(min_size=1, max_size=6) | st.sampled_from(
        [b"{", b"}", b"(", b")", b",", b"%", b"=", b"\x1b[2J", b"\xff", b"\x00", b"[",
         b"f32[", b"metadata={", b'"', b"\n"]))
    if what == "insert":
      data[at:at] = junk
    elif what == "replace":
      data[at:at + len(junk)] = junk
    else:
      data[at:at + draw(st.integers(1, 40))] = b""
  return bytes(data)


@_SETTINGS
@given(content=st.one_of(damaged_hlo(), st.binary(max_size=200)),
       switches=st.lists(st.sampled_from(["--json", "--markdown", "--all"]), max_size=1))
def test_file_contents(tmp_path_factory, content, switches):
  p = tmp_path_factory.mktemp("in") / "in.hlo"
  p.write_bytes(content)
  argv = ["file", str(p), *switches]
  _check(argv, *_run(argv))


@pytest.fixture(scope="module")
def saved_report(tmp_path_factory):
  d = tmp_path_factory.mktemp("diff")
  p = d / "m.hlo"
  p.write_text(HLO)
  code, out, _ = _run(["file", str(p), "--json"])
  assert code == 0
  (d / "good.json").write_text(out)
  return d, json.loads(out)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8)


@st.composite
def damaged_report(draw, report):
  """The saved report with one field, at any depth, replaced by any JSON."""
  doc = json.loads(json.dumps(report))
  node, path = doc, []
  while isinstance(node, (dict, list)) and node and draw(st.booleans()):
    key = draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                               else range(len(node))))
    path.append((node, key))
    node = node[key]
  if not path:
    return draw(_JSON)
  parent, key = path[-1]
  parent[key] = draw(_JSON)
  return doc


@_SETTINGS
@given(data=st.data())
def test_diff_of_damaged_reports(saved_report, data):
  d, report = saved_report
  bad = d / "bad.json"
  if data.draw(st.booleans()):
    bad.write_text(json.dumps(data.draw(damaged_report(report))))
  else:
    bad.write_bytes(data.draw(st.binary(max_size=64)))
  argv = ["diff", str(d / "good.json"), str(bad)]
  code, out, err = _run(argv)
  _check(argv, code, out, err)
  assert code != 1  # diff has no findings verdict


_VERBS = st.sampled_from(["example", "file", "run", "diff", "sweep", "targets", "calibrate",
                          "bogus", "", "--help-me", "-x"])


@_SETTINGS
@given(verb=_VERBS, rest=st.lists(st.sampled_from(
    ["--bogus", "--gpus", "-3", "0", "--target", "nosuchgpu",
     "--devices", "--set", "a=b", "--json", "--markdown", "\x1b[31m", "x:y", "--jobs",
     "--grid", "=", "--fail-on"]), max_size=4))
def test_flags_that_fail_before_any_work(verb, rest):
  # Only argument lists that fail before compiling anything: a flag that
  # takes a value given none, an unknown flag or verb, or a bad value.
  argv = [verb, *rest] if verb else rest
  if not any(a in ("--bogus", "\x1b[31m", "-3", "0", "nosuchgpu", "=") for a in argv) \
      and verb not in ("bogus", "", "--help-me", "-x"):
    return  # might be a valid command that compiles: not this test's business
  code, out, err = _run(argv)
  _check(argv, code, out, err)

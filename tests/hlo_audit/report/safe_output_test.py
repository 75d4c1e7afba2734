"""Text from the input (names, `op_name` and `source_file` metadata, a custom
call's target, a sweep's values and errors) reaches the terminal and Markdown
as characters that act on nothing: control characters as their escapes,
CommonMark's markup backslash-escaped, and still legible."""

from __future__ import annotations

import dataclasses
import functools
import html
import io
import re

import pytest
from rich.console import Console

import hlo_audit
from hlo_audit._src.cli.common import ExitCode
from hlo_audit._src.cli.main import run
from hlo_audit._src.report import layout, safe, terminal, what_if_text
from hlo_audit._src.report.layout import Column
from hlo_audit._src.report.units import fmt_source
from hlo_audit._src.sweep import report as sweep_report

# What a hostile dump's strings may hold: clear the screen, ring, return to
# the line's start, an OSC 8 hyperlink, a C1 CSI, a right-to-left override;
# HTML, a javascript: link, emphasis, a table pipe, a backtick run, rich
# markup and an emoji code.
RAW = ("\x1b[2J\x07\r\x1b]8;;http://x\x1b\\\x9b\u202e<img src=x onerror=alert(1)>"
       "[a](javascript:alert(1))|``y``[bold red]x[/]:red_heart:*em*_u_~~s~~")
# The escapes a reader sees in place of the control characters.
SHOWN = (r"\x1b[2J\x07\x0d\x1b]8;;", r"\x9b\u202e<img")
# Anything that acts on a terminal, bar the newline.
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Put before a character: it is bare, not backslash-escaped (an even run of
# backslashes before it, or none).
_BARE = r"(?<!\\)(?:\\\\)*"


def _hlo_string(s: str) -> str:
  """`s` as XLA prints a string: control bytes as C escapes, raw otherwise."""
  return re.sub(r'[\x00-\x1f\x7f-\x9f"\\]',
                lambda m: "\\" + m.group() if m.group() in '"\\' else f"\\x{ord(m.group()):02x}",
                s)


def hostile_hlo() -> str:
  """A scheduled module (so it has findings) whose metadata and custom call
  target hold `RAW`."""
  s = _hlo_string(RAW)
  return f"""HloModule evil, is_scheduled=true

ENTRY main {{
  p = f32[256,256]{{1,0}} parameter(0)
  cc = f32[256,256]{{1,0}} custom-call(p), custom_call_target="__cublas$gemm{s}", metadata={{op_name="jit(f)/{s}" source_file="/home/u/{s}a.py" source_line=3}}
  t = f32[256,256]{{0,1}} transpose(cc), dimensions={{1,0}}, metadata={{op_name="jit(f)/{s}" source_file="/home/u/{s}b.py" source_line=4}}
  ROOT c = f32[256,256]{{1,0}} copy(t), metadata={{op_name="jit(f)/c" source_file="/home/u/{s}c.py" source_line=5}}
}}
"""


@functools.cache
def hostile_report():
  r = hlo_audit.audit_hlo(hostile_hlo())
  assert r.findings and RAW in r.kernels[0].detail  # the strings came through whole
  return r


def assert_inert(out: str) -> None:
  bad = _UNSAFE.search(out)
  assert bad is None, (f"{bad.group()!r} reaches the output: "
                       f"{out[max(0, bad.start() - 60):bad.start() + 20]!r}")


def assert_shown(out: str) -> None:
  for s in SHOWN:
    assert s in out, f"{s!r} is not shown"


def rendered(md: str) -> str:
  """`md` as a CommonMark renderer with GFM tables shows it (HTML)."""
  markdown_it = pytest.importorskip("markdown_it")
  return markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)


def assert_markdown_inert(md: str) -> None:
  assert_inert(md)
  # Outside code spans (whose text is literal), nothing opens a tag or a link.
  bare = re.sub(r"(?<![\\`])(`+)(?!`).*?(?<![\\`])\1(?!`)", "", md)
  assert not re.search(_BARE + r"<img", bare)
  assert not re.search(_BARE + r"\]\(javascript:", bare)
  page = rendered(md)
  assert "<img" not in page and "<a " not in page and "<strong>em" not in page
  assert "<em>" not in page and "<s>" not in page and "<del>" not in page
  # Every table row has its header's cells: no pipe of the input split one.
  lines = md.splitlines()
  rows = 0
  for i, line in enumerate(lines):
    if not line.startswith("|"):
      continue
    cells = len(re.findall(_BARE + r"\|", line)) - 1
    if i + 1 < len(lines) and re.fullmatch(r"\|(?:-+:?\|)+", lines[i + 1]):
      width = cells  # a header, above its delimiter row
    assert cells == width, line
    rows += 1
  assert rows


# ---------------------------------------------------------------- safe ----


def test_printable_escapes_what_acts_on_a_terminal_and_keeps_the_rest():
  assert safe.printable("\x1b[2J\x07\r\x00\x7f") == r"\x1b[2J\x07\x0d\x00\x7f"
  assert safe.printable("\x9b\x85\u2028\u2029") == r"\x9b\x85\u2028\u2029"
  assert safe.printable("a\u202eb\u2066c\u202a") == r"a\u202eb\u2066c\u202a"
  # A byte read with surrogateescape: shown as that byte, and printable.
  assert safe.printable("f\udcff.py") == r"f\xff.py"
  assert safe.printable("f\udc80.py") == r"f\x80.py"  # the first such byte
  assert safe.printable("\ud800") == r"\ud800"
  assert safe.printable("a\nb") == r"a\x0ab"
  assert safe.printable_lines("a\x1b\nb") == "a\\x1b\nb"
  # Text without them comes back as it was, so escaping twice changes nothing.
  for s in ("fusion.12", "model_ü.py:3", "[bold]x[/]", "C:\\x\\y", "…"):
    assert safe.printable(s) == s
  assert safe.printable(safe.printable(RAW)) == safe.printable(RAW)
  assert safe.printable(42) == "42"


def test_markdown_text_renders_as_the_characters_it_holds():
  s = "<b>x</b> [a](javascript:1) ![i](x) *e* __s__ ~~d~~ `c` a|b &amp; # h \\ \x1b"
  out = safe.markdown_text(s)
  assert "\n" not in safe.markdown_text("a\nb")
  assert rendered(out) == f"<p>{html.escape(safe.printable(s), quote=False)}</p>\n"
  # A `_` between letters or digits is left bare: it cannot open emphasis.
  assert safe.markdown_text("d_model input_output_alias") == "d_model input_output_alias"
  assert safe.markdown_text("_x_ a_ _b") == r"\_x\_ a\_ \_b"
  assert rendered(safe.markdown_text("a_b_c _d_")) == "<p>a_b_c _d_</p>\n"


def test_code_span_and_fence_hold_any_backtick_run():
  # A span that starts (or only ends) with a backtick is padded at both ends.
  assert safe.code_span("`x") == "`` `x ``" and safe.code_span("x`") == "`` x` ``"
  assert safe.code_span("x") == "`x`"
  for s in ("evil", "ev`il", "``x``", "` a `", "a```b", "\x1b[2J`", "`x"):
    span = safe.code_span(s)
    page = rendered(span)
    assert page == f"<p><code>{html.escape(safe.printable(s), quote=False)}</code></p>\n", s
  assert safe.code_span("") == ""
  body = "a\n```\nb ````"
  page = rendered(safe.code_fence(body) + "\n\nafter")
  assert page == f"<pre><code>{html.escape(body, quote=False)}\n</code></pre>\n<p>after</p>\n"


# -------------------------------------------------------------- layout ----


def test_table_and_hang_measure_the_escaped_text():
  lines = layout.table((Column("name", "text"), Column("n", "num"), Column("src", "source")),
                       [("a\x1b[2Jb", "1", "x\r.py:3"), ("plain", "22", "y.py:4")], 80)
  assert_inert("\n".join(lines))
  assert lines[1].startswith("  a\\x1b[2Jb")
  # The column after it lines up: its width counted the escape's characters.
  ends = [line.index(cell) + 2 for line, cell in zip(lines, (" n ", " 1 ", "22 "))]
  assert len(set(ends)) == 1, lines
  assert lines[1].endswith(r"x\x0d.py:3")
  # A CR is shown, not taken for a space between words.
  assert layout.hang("at a\rb.py:3 now", 80) == [r"at a\x0db.py:3 now"]
  assert layout.wrap("\u2028x y", 80) == [r"\u2028x y"]


# ------------------------------------------------------------ terminal ----


@pytest.mark.parametrize("all_", [False, True])
def test_terminal_views_show_escapes_not_controls(all_):
  out = hostile_report().to_text(width=400, all=all_)
  assert_inert(out)
  assert_shown(out)
  assert "[bold red]x[/]:red_heart:" in out


def test_narrow_terminal_views_stay_inert():
  r = hostile_report()
  for width in (40, 80, 120):
    for all_ in (False, True):
      out = r.to_text(width=width, all=all_)
      assert_inert(out)
      assert r"\x1b[2J" in out


def test_module_name_summary_and_hints_are_escaped():
  r = hostile_report()
  r = dataclasses.replace(r, module=dataclasses.replace(r.module, name="m\x1b]0;title\x07"))
  assert_inert(r.summary())
  assert r"module m\x1b]0;title\x07" in r.summary()
  out = "\n".join(terminal.compact_lines(
      r, 100, hints=[("hlo-audit file /tmp/\x1b[2Je.hlo --all", "every \u202etable")]))
  assert_inert(out)
  assert r"hlo-audit: m\x1b]0;title\x07" in out
  assert r"hlo-audit file /tmp/\x1b[2Je.hlo --all  every \u202etable" in out
  # The commands' descriptions line up, measured on the escaped commands.
  lines = terminal.hint_lines([("run a\x1b[2J", "one"), ("run bbbbbbbb", "two")], 100)
  assert lines == ["Next:", r"  run a\x1b[2J  one", "  run bbbbbbbb  two"]


def test_hints_say_their_shared_command_once_when_one_is_too_wide():
  hints = [("hlo-audit f.hlo --all", "every table"), ("hlo-audit f.hlo --html r.html", "a page")]
  # The longer line, "  " + command + "  " + description, is exactly 39
  # characters: it fits 39 columns, so nothing is factored out.
  assert max(len(c) + len(w) + 4 for c, w in hints) == 39
  assert terminal.hint_lines(hints, 39)[0] == "Next:"
  # One line too wide is enough (the other still fits): the shared
  # "hlo-audit f.hlo" is said once, each command's rest listed under it.
  lines = terminal.hint_lines(hints, 38)
  assert lines[0] == "Next, add to hlo-audit f.hlo:", lines
  assert [l.split()[0] for l in lines[1:]] == ["--all", "--html"]


def test_a_line_built_without_escaping_is_escaped_on_its_way_out(monkeypatch):
  r = hostile_report()
  w = r.what_if(fuse=[r.findings[0]])
  # A renderer that forgot to escape: the last check still catches it.
  monkeypatch.setattr(what_if_text, "render_what_if", lambda w: "what-if: \x1b[2J\x9b")
  out = "\n".join(terminal.full_lines(r.with_what_if(w), 160))
  assert_inert(out)
  assert r"what-if: \x1b[2J\x9b" in out


def test_what_if_text_escapes_the_names_it_lists():
  r = hostile_report()
  w = r.what_if(fuse=[r.findings[0]])
  # Argument paths come from the caller's pytree keys, which may hold anything.
  w = dataclasses.replace(w, changes=(f"donate params['{RAW}']",),
                          live_at_peak=(RAW,), notes=(RAW,))
  text = str(w)
  assert_inert(text)
  assert_shown(text)
  for all_ in (False, True):
    out = r.with_what_if(w).to_text(width=200, all=all_)
    assert_inert(out)
    assert r"what-if: donate params['\x1b[2J" in out


def test_diff_text_escapes_names_and_metadata():
  r = hostile_report()
  d = r.diff(hlo_audit.audit_hlo(hostile_hlo().replace(_hlo_string(RAW), "ok")))
  assert d.kernels_removed  # the op_names and paths are listed
  text = str(d)
  assert_inert(text)
  assert_shown(text)
  d = dataclasses.replace(d, before="a\x1b[2J", after="b\u202e")
  assert str(d).startswith(r"diff a\x1b[2J -> b\u202e")


def test_rich_console_prints_names_as_written():
  f = io.StringIO()
  console = Console(file=f, width=400, color_system=None, force_terminal=False)
  hostile_report().print(console, all=True)
  out = f.getvalue()
  assert_inert(out)
  assert_shown(out)
  # Neither markup nor an emoji code is read in a name.
  assert "[bold red]x[/]:red_heart:" in out


# ------------------------------------------------------------ markdown ----


def test_markdown_escapes_every_cell_and_heading():
  r = hostile_report()
  md = r.to_markdown()
  assert_markdown_inert(md)
  page = rendered(md)
  # What the metadata said is shown whole, as text.
  for loc in {fmt_source(k.source) for k in r.kernels}:
    assert html.escape(safe.printable(loc), quote=False) in page, loc
  assert html.escape(safe.printable(r.kernels[0].detail), quote=False) in page
  assert page.count("<h3>") == 3 and "<h3>1. standalone copy or transpose at /home/u/" in page


def test_markdown_module_name_heading_and_summary_hold_backticks():
  r = hostile_report()
  name = "ev`il``` \x1b[2J<b>|"
  md = dataclasses.replace(r, module=dataclasses.replace(r.module, name=name)).to_markdown()
  assert_markdown_inert(md)
  page = rendered(md)
  shown = html.escape(safe.printable(name), quote=False)
  assert page.startswith(f"<h1>hlo-audit: <code>{shown}</code></h1>\n<pre><code>module {shown}\n")
  assert "<h2>Kernels by kind</h2>" in page


def test_sweep_markdown_escapes_values_errors_and_the_command():
  ok = {"id": "p0", "target": "t", "status": "ok", "params": {"dtype": RAW},
        "seconds": {"compile": 1.0, "total": 1.5}, "error": None,
        "audit": {"kernels": 3, "materialized_bytes": 2, "peak_bytes": 3, "xla_peak_bytes": 4,
                  "peak_agreement": -0.25, "bytes_saved": 1, "findings": 1, "actionable": 1,
                  "findings_by_class": {RAW: 1}, "bytes_saved_by_class": {RAW: 1},
                  "platform": RAW}}
  bad = {"id": "p`1", "target": "t", "status": "error", "params": {"dtype": RAW},
         "seconds": {"compile": 0.0, "total": 0.5}, "error": f"ValueError: {RAW}",
         "traceback": "Traceback ..."}
  md = sweep_report.render_markdown(f"evil{RAW}", [ok, bad], ["dtype"], [],
                                    command=f"hlo-audit sweep {RAW}")
  assert_markdown_inert(md)
  page = rendered(md)
  shown = html.escape(safe.printable(RAW), quote=False)
  assert page.startswith(f"<h1>Sweep: <code>evil{shown}</code></h1>")
  assert f"<li>command: hlo-audit sweep {shown}</li>" in page
  assert f"<li><code>p`1</code> dtype={shown}: ValueError: {shown}</li>" in page
  assert f"<td>{shown}</td>" in page


# ----------------------------------------------------------------- cli ----


def test_cli_file_views_are_inert(tmp_path, capsys):
  path = tmp_path / "evil.hlo"
  path.write_text(hostile_hlo())
  for flags in ([], ["--all"], ["--width", "60"]):
    assert run(["file", str(path), *flags]) == ExitCode.OK
    out = capsys.readouterr().out
    assert_inert(out)
    assert r"\x1b[2J" in out, flags
  assert run(["file", str(path), "--markdown"]) == ExitCode.OK
  assert_markdown_inert(capsys.readouterr().out)


def test_html_page_shows_control_characters_and_overrides_escaped(tmp_path):
  # html.escape leaves control characters and a right-to-left override as
  # they are: in a browser U+202E reorders what the reader sees.
  path = tmp_path / "r.html"
  hostile_report().to_html(str(path))
  page = path.read_text(encoding="utf-8")
  bad = re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", page)
  assert bad is None, page[max(0, bad.start() - 60):bad.start() + 20]
  assert r"\u202e&lt;img" in page and "<img" not in page

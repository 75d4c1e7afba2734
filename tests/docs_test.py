"""The manual's examples run: every ```python block of README.md and docs/*.md.

A page's blocks run in order in one namespace, as a reader would paste them,
in a scratch folder (files they write land there): `docs_support.run_page`,
whose run docs_samples_test.py compares with the pages' output samples. A
block whose first line is `# not run: <why>` is skipped (it needs a GPU, a
file of the reader's, or minutes), and says why.

The manual's links hold too: every relative link of README.md and docs/*.md
names a file that exists (and, for a Markdown file, a heading it has), and
README and docs/index.md list every page of docs/. README's first lines are
the two commands a newcomer runs, and the second is the one CI runs.
"""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from tests import docs_support
from tests.docs_support import PAGES, ROOT, blocks

_SKIP = re.compile(r"#\s*not run:\s*\S")
_FENCE = re.compile(r"^([ \t]*)```.*?^\1```[^\n]*$", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", re.MULTILINE)

pytest_plugins = ("pytester",)


def test_every_page_is_found_and_skips_say_why():
  assert ROOT / "README.md" in PAGES
  for page in PAGES:
    for line, code in blocks(page):
      first = code.lstrip().splitlines()[0] if code.strip() else ""
      if first.startswith("# not run"):
        assert _SKIP.match(first), f"{page.name}:{line}: say why it is not run"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_run(page):
  runs = docs_support.run_page(page)
  for run in runs:
    if run.error:
      raise AssertionError(f"{page.relative_to(ROOT)}, the block at line {run.fence.line}: "
                           f"{run.error}")
  assert any(r.stdout is not None for r in runs), f"{page.name}: every block is skipped"


def _prose(page: pathlib.Path) -> str:
  """`page`'s text without fenced blocks (headings and links there are code)."""
  return _FENCE.sub("", page.read_text())


def anchors(page: pathlib.Path) -> set[str]:
  """The anchors GitHub gives `page`'s headings: lower case, punctuation
  dropped, spaces to hyphens, repeats numbered."""
  seen: dict[str, int] = {}
  out = set()
  for m in _HEADING.finditer(_prose(page)):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text
    slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def links(page: pathlib.Path) -> list[str]:
  """The link targets of `page`'s prose (not of code)."""
  return _LINK.findall(_CODE_SPAN.sub("", _prose(page)))


def test_anchors_follow_github():
  page = ROOT / "docs" / "kernels.md"
  assert "5-compiled-for-sm_90a-on-a-cpu" in anchors(page)
  assert "1-the-target-where-the-operands-are-never-the-default-backend" in anchors(page)
  assert "python--m-pallas_kernels" in anchors(ROOT / "docs" / "cli.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_exist(page):
  broken = []
  for target in links(page):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
      broken.append(f"{target}: no such file")
    elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
      broken.append(f"{target}: {dest.name} has no heading #{anchor}")
  assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("contents", ["README.md", "docs/index.md"])
def test_every_page_is_listed(contents):
  page = ROOT / contents
  listed = {(page.parent / t.partition("#")[0]).resolve() for t in links(page)}
  missing = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
             if p.resolve() not in listed and p != page]
  assert not missing, f"{contents} does not link {missing}"


def _commands(fence: docs_support.Fence) -> list[str]:
  """A bash block's commands, comments and blank lines left out."""
  return [line.split("  #")[0].strip() for line in fence.body.splitlines()
          if line.strip() and not line.lstrip().startswith("#")]


def test_readme_begins_with_the_two_commands_and_ci_runs_the_second():
  readme = ROOT / "README.md"
  first = docs_support.fences(readme)[0]
  assert first.info == "bash" and first.line <= 5, "README's first lines: the two commands"
  audit, test = _commands(first)
  venv = "python3 -m venv .venv && . .venv/bin/activate && "
  assert audit == venv + "pip install -e . && hlo-audit example", audit
  assert test == venv + "pip install -e '.[test]' && python -m pytest", test
  ci = (ROOT / ".ci" / "run").read_text()
  # .ci/run: README's test command in .venv (pytest's -q and the results file
  # the split check reads aside: neither selects a test), on a clean clone.
  assert '"$py311" -m venv .venv' in ci and "-e '.[test]'" in ci
  assert re.search(r'^python -m pytest -q( --junitxml="[^"\s]+")?$', ci, re.MULTILINE), \
      "CI no longer runs README's command"


def test_testing_md_first_run_passes_as_written(pytester):
  """testing.md's first lines: its first block saved as test_fusion.py, the
  commands its first bash block gives each pass, in order."""
  page = ROOT / "docs" / "testing.md"
  found = docs_support.fences(page)
  code = next(f for f in found if f.info == "python")
  commands = next(f for f in found if f.info == "bash")
  assert commands.line < code.line, "testing.md says what to run before the code"
  assert code.body.startswith("# test_fusion.py")
  pytester.makepyfile(test_fusion=code.body)
  for command in _commands(commands):
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "pytest"], command
    result = pytester.runpytest_inprocess(*argv[3:], "-p", "no:cacheprovider")
    assert result.ret == 0, f"{command}:\n" + "\n".join(result.outlines[-30:])
    result.assert_outcomes(passed=3)

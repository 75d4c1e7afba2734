"""The manual's examples run: every ```python block of README.md and docs/*.md.

A page's blocks run in order in one namespace, as a reader would paste them,
in a scratch folder (files they write land there). A block whose first line
is `# not run: <why>` is skipped (it needs a GPU, a file of the reader's, or
minutes), and says why.

The manual's links hold too: every relative link of README.md and docs/*.md
names a file that exists (and, for a Markdown file, a heading it has), and
README and docs/index.md list every page of docs/.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
_SKIP = re.compile(r"#\s*not run:\s*\S")
_FENCE = re.compile(r"^([ \t]*)```.*?^\1```[^\n]*$", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", re.MULTILINE)


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """(line, code) of each python block of `page`, indented ones (in a list
  item) included, their indent removed."""
  text = page.read_text()
  out = []
  for m in _BLOCK.finditer(text):
    indent, code = m.group(1), m.group(2)
    lines = code.splitlines(keepends=True)
    code = "".join(line[len(indent):] if line.startswith(indent) else line for line in lines)
    out.append((text.count("\n", 0, m.start()) + 2, code))
  return out


def test_every_page_is_found_and_skips_say_why():
  assert ROOT / "README.md" in PAGES
  for page in PAGES:
    for line, code in blocks(page):
      first = code.lstrip().splitlines()[0] if code.strip() else ""
      if first.startswith("# not run"):
        assert _SKIP.match(first), f"{page.name}:{line}: say why it is not run"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_run(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  namespace: dict = {"__name__": f"doc_{page.stem}"}
  ran = 0
  for line, code in blocks(page):
    if _SKIP.match(code.lstrip()):
      continue
    try:
      exec(compile(code, f"{page.name}:{line}", "exec"), namespace)  # noqa: S102
    except Exception as e:
      raise AssertionError(f"{page.relative_to(ROOT)}, the block at line {line}: "
                           f"{type(e).__name__}: {e}") from e
    ran += 1
  assert ran, f"{page.name}: every block is skipped"
  assert os.getcwd() == str(tmp_path)


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

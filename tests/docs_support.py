"""The manual as its tests read it: fenced blocks, the comment before each
output sample, one run of each page's Python blocks, and one run of each
command a sample shows.

An output sample is a ```text (or bare ```) block. The HTML comment right
before it (invisible on the rendered page) says how it is made, or why it is
not checked here:

  <!-- sample (jax 0.10.2, as layer.py, 100 columns): python -->
      what the page's Python blocks since the previous sample print, those
      blocks saved as `layer.py` (so source lines read `layer.py:5`) and run
      with COLUMNS=100;
  <!-- sample (jax 0.10.2): $ hlo-audit example --sort peak --top 3 --width 100 -->
      what the command prints (stdout and stderr), run in this process from
      the repository's root (a command with --out, in a scratch folder);
  <!-- sample (jax 0.12.0.1, gpu-target): $ hlo-audit example --target h200 -->
      needs the CUDA plugin wheels (`pip install -e '.[gpu-target]'`);
  <!-- sample (jax 0.10.2, tpu-target): $ hlo-audit example --target v5e -->
      needs libtpu (`pip install -e '.[tpu-target]'`);
  <!-- not checked: <why> -->

`jax X` names the jax that made the sample: under that jax every number but
times, percentages and ratios must be the sample's; under another, only the
words (see `compare`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = tuple(sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]))

_FENCE = re.compile(r"^([ \t]*)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)
_COMMENT_BEFORE = re.compile(r"<!--((?:(?!-->).)*)-->\s*\Z", re.DOTALL)
_SAMPLE = re.compile(r"sample\s*\(([^)]*)\)\s*:\s*(\S.*)", re.DOTALL)
_NOT_CHECKED = re.compile(r"not checked:\s*\S", re.DOTALL)
#: Fence info strings of output samples.
SAMPLE_INFOS = ("text", "")


@dataclasses.dataclass(frozen=True)
class Fence:
  """One fenced block of a page."""

  page: pathlib.Path
  #: The page's line of the block's first line (after the opening fence).
  line: int
  #: The fence's info string: "python", "bash", "text", "".
  info: str
  #: The block's text, its indent (in a list item) removed.
  body: str
  #: The HTML comment right before the fence, without `<!--` and `-->`.
  comment: str | None

  @property
  def where(self) -> str:
    return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Spec:
  """How a checked sample is made (the comment before it)."""

  #: The jax that made the sample, e.g. "0.10.2".
  jax: str
  #: "python" (the page's blocks since the previous sample) or a command.
  source: str
  #: The file name the Python blocks are saved as ("" for the page's name).
  filename: str = ""
  #: COLUMNS for the Python blocks (None: unset).
  columns: int | None = None
  #: Needs the CUDA plugin wheels (the gpu-target extra).
  gpu_target: bool = False
  #: Needs libtpu (the tpu-target extra).
  tpu_target: bool = False

  @property
  def command(self) -> str | None:
    return self.source[2:].strip() if self.source.startswith("$ ") else None


def fences(page: pathlib.Path) -> tuple[Fence, ...]:
  """Every fenced block of `page`, in order."""
  text = page.read_text()
  out = []
  for m in _FENCE.finditer(text):
    indent, info, body = m.group(1), m.group(2).strip(), m.group(3)
    body = "".join(line[len(indent):] if line.startswith(indent) else line
                   for line in body.splitlines(keepends=True))
    before = _COMMENT_BEFORE.search(text, 0, m.start())
    comment = " ".join(before.group(1).split()) if before else None
    out.append(Fence(page, text.count("\n", 0, m.start()) + 2, info, body, comment))
  return tuple(out)


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """(line, code) of each python block of `page`, indented ones (in a list
  item) included, their indent removed."""
  return [(f.line, f.body) for f in fences(page) if f.info == "python"]


def samples(page: pathlib.Path) -> tuple[Fence, ...]:
  return tuple(f for f in fences(page) if f.info in SAMPLE_INFOS)


def spec_of(fence: Fence) -> Spec | None:
  """The sample's spec, None where its comment says it is not checked;
  ValueError where it has neither, or a malformed one."""
  comment = fence.comment or ""
  if _NOT_CHECKED.match(comment):
    return None
  m = _SAMPLE.match(comment)
  if not m:
    raise ValueError(f"{fence.where}: an output sample needs a comment before it, "
                     "'<!-- sample (jax X): python -->', '<!-- sample (jax X): $ COMMAND -->' "
                     "or '<!-- not checked: WHY -->'")
  attrs = [a.strip() for a in m.group(1).split(",") if a.strip()]
  fields: dict = {"source": m.group(2).strip()}
  for a in attrs:
    if a.startswith("jax "):
      fields["jax"] = a[4:].strip()
    elif a.startswith("as "):
      fields["filename"] = a[3:].strip()
    elif a.endswith(" columns"):
      fields["columns"] = int(a.split()[0])
    elif a == "gpu-target":
      fields["gpu_target"] = True
    elif a == "tpu-target":
      fields["tpu_target"] = True
    else:
      raise ValueError(f"{fence.where}: unknown sample attribute {a!r}")
  if "jax" not in fields:
    raise ValueError(f"{fence.where}: say which jax made the sample: 'sample (jax X): ...'")
  spec = Spec(**fields)
  if spec.source != "python" and not (spec.command or "").startswith("hlo-audit "):
    raise ValueError(f"{fence.where}: a sample is made by 'python' or '$ hlo-audit ...', "
                     f"not {spec.source!r}")
  return spec


# ---------------------------------------------------------------- runs ----

_SKIP = re.compile(r"#\s*not run:\s*\S")


@dataclasses.dataclass(frozen=True)
class BlockRun:
  fence: Fence
  #: What it printed (None: not run, skipped or after a failure).
  stdout: str | None
  #: "TypeError: ..." where it raised.
  error: str | None = None


@contextlib.contextmanager
def _in_folder(path: pathlib.Path | str):
  old = os.getcwd()
  os.chdir(path)
  try:
    yield
  finally:
    os.chdir(old)


#: The CPU facts the samples' estimates use: measured once on a 2-core Xeon
#: (`hlo-audit calibrate`'s DeviceFacts). A sample ranked by time, or by peak
#: with ties broken by time, keeps its order on every machine only with the
#: same rates; a machine's own measurement (under CI's two parallel suites,
#: say) may swap two rows whose estimates are close.
CPU_FACTS = pathlib.Path(__file__).resolve().parent / "docs_cpu_facts.json"


@contextlib.contextmanager
def _pinned_cpu_facts():
  from hlo_audit._src.target import calibration
  from hlo_audit._src.target.devices import DeviceFacts

  facts = DeviceFacts.from_dict(json.loads(CPU_FACTS.read_text(encoding="utf-8")))
  with calibration._lock:
    old, calibration._facts = calibration._facts, facts
  try:
    yield
  finally:
    with calibration._lock:
      calibration._facts = old


@contextlib.contextmanager
def _env(name: str, value: str | None):
  old = os.environ.get(name)
  if value is not None:
    os.environ[name] = value
  try:
    yield
  finally:
    if old is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = old


def _block_specs(page: pathlib.Path) -> dict[int, Spec]:
  """Each python block's line -> the spec of the first checked python
  sample after it (which names the file it is saved as and its COLUMNS)."""
  out, pending = {}, []
  for f in fences(page):
    if f.info == "python":
      pending.append(f.line)
    elif f.info in SAMPLE_INFOS:
      try:
        spec = spec_of(f)
      except ValueError:
        spec = None
      if spec is not None and spec.source == "python":
        out.update(dict.fromkeys(pending, spec))
        pending = []
  return out


def _scratch(prefix: str) -> pathlib.Path:
  """A fresh folder, removed when the tests end."""
  path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


@functools.cache
def run_page(page: pathlib.Path) -> tuple[BlockRun, ...]:
  """Runs `page`'s python blocks in order in one namespace, as a reader
  pastes them, in a scratch folder (files they write land there), each
  block's stdout captured. A block whose first line is `# not run: <why>` is
  skipped; after a block raises, none runs. Once per page per session."""
  specs = _block_specs(page)
  namespace: dict = {"__name__": f"doc_{page.stem}"}
  runs: list[BlockRun] = []
  failed = False
  scratch = _scratch(f"doc_{page.stem}_")
  with _in_folder(scratch), _pinned_cpu_facts():
    for f in fences(page):
      if f.info != "python":
        continue
      if failed or _SKIP.match(f.body.lstrip()):
        runs.append(BlockRun(f, None))
        continue
      spec = specs.get(f.line)
      name = spec.filename if spec and spec.filename else f"{page.name}:{f.line}"
      columns = str(spec.columns) if spec and spec.columns else None
      out = io.StringIO()
      try:
        with _env("COLUMNS", columns), contextlib.redirect_stdout(out):
          exec(compile(f.body, name, "exec"), namespace)  # noqa: S102
      except Exception as e:  # noqa: BLE001 - reported by the tests
        runs.append(BlockRun(f, out.getvalue(), f"{type(e).__name__}: {e}"))
        failed = True
        continue
      if pathlib.Path.cwd().resolve() != scratch.resolve():
        runs.append(BlockRun(f, out.getvalue(), "the block changed the working folder"))
        failed = True
        os.chdir(scratch)
        continue
      runs.append(BlockRun(f, out.getvalue()))
  return tuple(runs)


def python_output(sample: Fence) -> str:
  """What the page's python blocks between the previous sample and this one
  printed."""
  start = max((f.line for f in samples(sample.page) if f.line < sample.line), default=0)
  runs = [r for r in run_page(sample.page) if start < r.fence.line < sample.line]
  if not runs:
    raise AssertionError(f"{sample.where}: no python block before this sample")
  for r in runs:
    if r.error:
      raise AssertionError(f"{r.fence.where}: {r.error}")
    if r.stdout is None and not _SKIP.match(r.fence.body.lstrip()):
      raise AssertionError(f"{r.fence.where}: not run: a block before it failed")
  return "".join(r.stdout or "" for r in runs)


@functools.cache
def run_command(command: str) -> tuple[int, str]:
  """`hlo-audit ...` run in this process: its exit status, and what it
  wrote to stdout and stderr, interleaved. From the repository's root, as from a clone; a command that
  writes a folder (`--out`) runs in a scratch folder."""
  from hlo_audit._src.cli import main

  argv = shlex.split(command)
  assert argv[0] == "hlo-audit", command
  folder = _scratch("doc_cmd_") if "--out" in argv else ROOT
  out = io.StringIO()  # stdout and stderr as a terminal interleaves them
  with _in_folder(folder), _pinned_cpu_facts(), contextlib.redirect_stdout(out), \
      contextlib.redirect_stderr(out):
    code = main.run(argv[1:])
  return int(code), out.getvalue()


# ------------------------------------------------------------- compare ----

_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_BYTES = frozenset({"B", "KiB", "MiB", "GiB", "TiB"})
#: Units of numbers that move from machine to machine or run to run.
_FREE = frozenset({"ns", "us", "ms", "s", "%", "x"})
_TIME_UNITS = frozenset({"ns", "us", "ms", "s"})
#: A finding summary's classes, in an order that follows the ranking (which
#: on a CPU follows this machine's measured rates): compared sorted.
_CLASS_LIST = re.compile(r"(propose a change \()([^)]*)(\))")


def _normalized(text: str) -> str:
  def sort(m: re.Match) -> str:
    items = sorted((" ".join(i.split()) for i in m.group(2).split(",")),
                   key=lambda item: item.partition(" ")[2])
    return m.group(1) + ", ".join(items) + m.group(3)
  return _CLASS_LIST.sub(sort, " ".join(text.split()))


def _without_prompts(sample: str) -> list[str]:
  """The sample's lines, less a shown command (`$ ...` and its `\\`
  continuation lines)."""
  lines, continued = [], False
  for line in sample.splitlines():
    if continued or line.lstrip().startswith("$ "):
      continued = line.rstrip().endswith("\\")
      continue
    lines.append(line)
  return lines


def _line_pattern(tokens: list[str]) -> tuple[re.Pattern, list[tuple[str, str]]]:
  """A regex for one sample line over normalized text (single spaces), with
  a group per number, and each number's (text, kind): "bytes", "free" or
  "count"."""
  parts, numbers = [], []
  # Tokens that are the unit of a time: a time moves between machines, and
  # with it its unit (933 us here, 1.13 ms there).
  time_units: set[int] = set()
  for i, tok in enumerate(tokens):
    if tok == "...":
      parts.append(".*?")
      continue
    if i in time_units:
      rest = tok[len(tok.rstrip(")(,;:.")):]  # the punctuation after the unit
      parts.append("(?:" + "|".join(sorted(_TIME_UNITS, key=len, reverse=True)) + ")"
                   + re.escape(rest))
      continue
    piece, pos = "", 0
    for m in re.finditer(rf"{_NUMBER}|\.\.\.", tok):
      piece += re.escape(tok[pos:m.start()])
      if m.group() == "...":
        piece += ".*?"
      else:
        after = tok[m.end():].lstrip(")(,;:") or (tokens[i + 1] if i + 1 < len(tokens) else "")
        unit = after.rstrip(")(,;:.")
        kind = ("bytes" if unit in _BYTES else
                "free" if unit in _FREE or "e" in m.group().lower() or after.startswith("%")
                or (after.startswith("x") and not after[1:2].isalnum()) else "count")
        numbers.append((m.group(), kind))
        piece += f"({_NUMBER})"
        if unit in _TIME_UNITS and not tok[m.end():].strip(")(,;:"):
          time_units.add(i + 1)
      pos = m.end()
    parts.append(piece + re.escape(tok[pos:]))
  pattern = ""
  for i, p in enumerate(parts):
    if i:
      pattern += " ?" if tokens[i] == "..." or tokens[i - 1] == "..." else " "
    pattern += p
  return re.compile(pattern), numbers


def compare(sample: str, output: str, exact: bool) -> list[str]:
  """Where `output` departs from `sample` (empty: it matches).

  Both are compared word by word, whitespace and line breaks aside (widths
  wrap differently); `...` in the sample stands for anything. With `exact`
  (the jax that made the sample), the sample's lines must appear in order,
  each right after the one before (unless `...` comes between), and every
  number must be the sample's, as printed, but times, percentages and
  ratios, which move from machine to machine. Without it (another jax,
  whose XLA fuses differently), each line must appear somewhere with its
  words, numbers aside: headings, column names, row classes, shapes' ranks
  and sources' files hold across versions, counts and bytes do not."""
  out = _normalized(output)
  problems = []
  pos, anchored = 0, False
  lines = [_normalized(line) for line in _without_prompts(_normalized_lines(sample))]
  for line in lines:
    tokens = line.split()
    if not tokens:
      continue
    if tokens == ["..."]:
      anchored = False
      continue
    rx, numbers = _line_pattern(tokens)
    if exact and anchored:
      m = rx.match(out, pos)
    elif exact:
      # After `...` the line may be any later one: the first whose counts and
      # bytes are the sample's (times, and with them their units, match any
      # row of the table), else the first of its words.
      found = list(rx.finditer(out, pos))
      m = next((f for f in found
                if all(kind == "free" or got == want
                       for (want, kind), got in zip(numbers, f.groups()))),
               found[0] if found else None)
    else:
      m = rx.search(out)
    if m is None:
      where = "right after the line before" if exact and anchored else "in the output"
      problems.append(f"not found {where}: {line}")
      if exact:
        break
      continue
    if exact:
      for (want, kind), got in zip(numbers, m.groups()):
        if kind != "free" and got != want:
          problems.append(f"{want} is now {got} ({kind}) in: {line}")
      pos = m.end() + (1 if out[m.end():m.end() + 1] == " " else 0)
      anchored = not tokens[-1].endswith("...")
  return problems


def _normalized_lines(sample: str) -> str:
  """The sample with a wrapped class list joined onto one line (it is
  compared sorted)."""
  def join(m: re.Match) -> str:
    return m.group(1) + " ".join(m.group(2).split()) + m.group(3)
  return _CLASS_LIST.sub(join, sample)

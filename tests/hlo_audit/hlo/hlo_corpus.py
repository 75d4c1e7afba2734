"""The third-party HLO corpus: where it is, and its index.

The corpus (`../shared/hlo_corpus` next to the repository, or `$HLO_CORPUS`)
holds 9,473 HLO modules from openxla/xla with what XLA's parser made of each
(INDEX.tsv). Its files are read in place, never copied.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
#: The jaxlib whose XLA parser made INDEX.tsv's `xla_parses` and counts (the
#: corpus README, "How the xla_parses check was done"). Other jaxlibs' parsers
#: differ on a few modules: tests compare with those columns only where this
#: jaxlib is installed, and otherwise with XLA's parser run live.
INDEX_JAXLIB = "0.10.2"
#: Where the corpus is looked for when $HLO_CORPUS is not set.
DEFAULT_CORPUS = REPO_ROOT / ".." / "shared" / "hlo_corpus"


def corpus_path() -> Path:
  env = os.environ.get("HLO_CORPUS")
  return Path(env) if env else DEFAULT_CORPUS


def corpus_missing_reason() -> str | None:
  """Why the corpus cannot be used, or None if it can."""
  path = corpus_path()
  if not (path / "INDEX.tsv").is_file():
    return (f"HLO corpus not found: no INDEX.tsv in {path.resolve()} "
            "(put it at ../shared/hlo_corpus next to the repository or set "
            "HLO_CORPUS)")
  return None


@dataclasses.dataclass(frozen=True)
class CorpusModule:
  """One row of INDEX.tsv."""

  file: str  # relative to the corpus folder
  path: str  # absolute
  tags: frozenset[str]
  xla_parses: bool
  xla_computations: int | None
  xla_instructions: int | None
  xla_error: str

  @property
  def folder(self) -> str:
    """Top folder, with `rejected/` kept: "xla_hlo", "rejected/xla_docs"."""
    parts = self.file.split("/")
    return "/".join(parts[:2]) if parts[0] == "rejected" else parts[0]

  def read(self) -> str:
    """The module text, exactly as stored (line endings kept)."""
    with open(self.path, encoding="utf-8", errors="surrogateescape",
              newline="") as f:
      return f.read()


class Corpus:
  """The corpus index."""

  def __init__(self, root: Path):
    self.root = root.resolve()
    with open(self.root / "INDEX.tsv", encoding="utf-8", newline="") as f:
      rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    self.modules = [CorpusModule(
        file=r["file"], path=str(self.root / r["file"]),
        tags=frozenset(t.split("=")[0] for t in r["tags"].split(",") if t),
        xla_parses=r["xla_parses"] == "yes",
        xla_computations=int(r["xla_computations"]) if r["xla_computations"] else None,
        xla_instructions=int(r["xla_instructions"]) if r["xla_instructions"] else None,
        xla_error=r["xla_error"]) for r in rows]

  @property
  def accepted(self) -> list[CorpusModule]:
    return [m for m in self.modules if m.xla_parses]

  @property
  def rejected(self) -> list[CorpusModule]:
    return [m for m in self.modules if not m.xla_parses]

  def spread_sample(self, n: int) -> list[CorpusModule]:
    """About `n` modules spread evenly over every folder (rejected ones
    included), plus the modules with odd line endings. Deterministic."""
    by_folder: dict[str, list[CorpusModule]] = {}
    for m in self.modules:
      by_folder.setdefault(m.folder, []).append(m)
    frac = n / len(self.modules)
    out = []
    for mods in by_folder.values():
      k = min(len(mods), max(3, math.ceil(len(mods) * frac)))
      step = len(mods) / k
      out += [mods[int(i * step)] for i in range(k)]
    chosen = {m.file for m in out}
    out += [m for m in self.modules
            if m.tags & {"crlf", "cr_only_eol"} and m.file not in chosen]
    return out

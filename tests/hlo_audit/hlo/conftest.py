"""Shared fixtures of the HLO parser tests: the corpus, and XLA as reference.

Tests that need the corpus (see hlo_corpus.py) skip, with the reason, when
it is absent.

XLA's own parser (`jaxlib._hlo.hlo_module_from_text`, run in worker processes
by `xla_reference.py`) is the live reference for names and opcodes. It needs
about 60 s of CPU for the corpus, most of it in 7 modules whose elided
constants (`constant({...})`) make XLA fill literals of up to 800 MB. So the
run starts in the background, in two balanced shards (worker processes;
$HLO_XLA_WORKERS changes how many), as soon as collection finds a test that
asks for `xla_corpus_results`; those tests run last, the others meanwhile.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Iterable

import pytest
from hlo_corpus import Corpus, corpus_missing_reason, corpus_path


@pytest.fixture(scope="session")
def corpus() -> Corpus:
  reason = corpus_missing_reason()
  if reason:
    pytest.skip(reason)
  return Corpus(corpus_path())


# ------------------------------------------------------- XLA as reference ---

_ELIDED = re.compile(r"\[([0-9,]*)\][^\n=]*?constant\(\{\.\.\.\}\)")


def _xla_cost(path: str) -> float:
  """Rough seconds XLA takes for a module: its size, and the bytes of the
  literals it allocates for elided constants."""
  with open(path, encoding="utf-8", errors="surrogateescape") as f:
    text = f.read()
  elided = 0
  for m in _ELIDED.finditer(text):
    elided += 4 * math.prod(int(d) for d in m.group(1).split(",") if d)
  return 5e-4 + 3e-7 * len(text) + 9e-9 * elided


class XlaRun:
  """XLA's parser over many files, in background shards."""

  def __init__(self, paths: Iterable[str], shards: int | None = None):
    if shards is None:
      shards = max(1, int(os.environ.get("HLO_XLA_WORKERS", "2")))
    self.results: dict[str, dict] = {}
    self.errors: list[BaseException] = []
    self._stop = threading.Event()
    loads = [0.0] * shards
    parts: list[list[str]] = [[] for _ in range(shards)]
    # Longest first, each to the least loaded shard.
    for cost, path in sorted(((_xla_cost(p), p) for p in paths), reverse=True):
      i = loads.index(min(loads))
      loads[i] += cost
      parts[i].append(path)
    self._threads = [threading.Thread(target=self._run, args=(p,), daemon=True)
                     for p in parts if p]
    for t in self._threads:
      t.start()

  def _run(self, paths: list[str]) -> None:
    import xla_reference  # noqa: PLC0415 - next to this file, on sys.path
    gen = xla_reference.parse_with_xla(paths)
    try:
      for result in gen:
        self.results[result["path"]] = result
        if self._stop.is_set():
          break
    except BaseException as e:  # noqa: BLE001 - reported by wait()
      self.errors.append(e)
    finally:
      gen.close()

  def wait(self) -> dict[str, dict]:
    for t in self._threads:
      t.join()
    if self.errors:
      raise RuntimeError(f"XLA reference run failed: {self.errors[0]!r}")
    return self.results

  def stop(self) -> None:
    self._stop.set()


def _xla_missing_reason() -> str | None:
  try:
    from jaxlib import _hlo  # noqa: F401, PLC0415
  except ImportError as e:
    return f"jaxlib._hlo is not importable ({e}): no XLA reference"
  return None


def xla_live_paths(corpus: Corpus) -> list[str]:
  """Modules XLA accepts, less those XLA's parser runs out of memory on."""
  return [m.path for m in corpus.accepted if "xla_memory_error" not in m.tags]


_XLA_RUN: XlaRun | None = None


def pytest_collection_modifyitems(config, items):
  """Starts XLA on the corpus early if a selected test will need it, and
  runs the tests that wait for it last, so the others run meanwhile."""
  global _XLA_RUN
  waiting = [i for i in items if "xla_corpus_results" in getattr(i, "fixturenames", ())]
  if not waiting:
    return
  ids = {id(i) for i in waiting}
  items[:] = [i for i in items if id(i) not in ids] + waiting
  if _XLA_RUN is not None or config.option.collectonly:
    return
  if corpus_missing_reason() or _xla_missing_reason():
    return
  _XLA_RUN = XlaRun(xla_live_paths(Corpus(corpus_path())))


def pytest_sessionfinish(session, exitstatus):
  if _XLA_RUN is not None:
    _XLA_RUN.stop()


@pytest.fixture(scope="session")
def xla_corpus_results(corpus) -> dict[str, dict]:
  """path -> XLA's result (see xla_reference.parse_with_xla) for every module
  in `xla_live_paths`."""
  global _XLA_RUN
  reason = _xla_missing_reason()
  if reason:
    pytest.skip(reason)
  if _XLA_RUN is None:  # not started at collection (e.g. run programmatically)
    _XLA_RUN = XlaRun(xla_live_paths(corpus))
  return _XLA_RUN.wait()

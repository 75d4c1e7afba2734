"""paused_gc: the collector is off inside and restored after, and a caller's
own freeze (e.g. before a fork) is left alone."""

from __future__ import annotations

import gc

import pytest

from hlo_audit._src.gc_pause import paused_gc


def test_collector_off_inside_and_restored_after_an_error():
  assert gc.isenabled()
  with pytest.raises(ValueError):
    with paused_gc():
      assert not gc.isenabled()
      raise ValueError
  assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
  gc.disable()
  try:
    with paused_gc():
      assert not gc.isenabled()
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_objects_made_inside_are_not_left_young_and_a_freeze_is_kept():
  with paused_gc():
    made = [[i] for i in range(10_000)]
  # Moved to the oldest generation on the way out, so no young collection
  # visits them (a collection would have left them in a younger one).
  ids = {id(x) for x in made}
  assert sum(id(o) in ids for o in gc.get_objects(generation=2)) == len(made)
  del made
  sentinel = [None]
  gc.freeze()
  try:
    with paused_gc():
      _ = [[i] for i in range(100)]
    # The program's freeze is kept: its objects are still frozen, outside
    # every generation. (Not the count: frozen objects freed meanwhile, by
    # another thread of an earlier test, lower it; a CI failure.)
    assert gc.get_freeze_count() > 0
    assert not any(o is sentinel for o in gc.get_objects())
  finally:
    gc.unfreeze()
  assert any(o is sentinel for o in gc.get_objects())  # the check can see it


def test_the_interpreters_own_freeze_does_not_block_the_step(monkeypatch):
  """CPython 3.12 freezes a few hundred objects at start-up: those are not
  the program's, so the step still runs (thawing them, as any unfreeze would),
  also after some of them died."""
  from hlo_audit._src import gc_pause
  dies = [[i] for i in range(100)]
  gc.freeze()  # stands in for the interpreter's start-up freeze
  try:
    monkeypatch.setattr(gc_pause, "_interpreter_frozen", gc.get_freeze_count())
    with paused_gc():
      # Frozen objects can die meanwhile (here, or in another thread: the
      # CI failure of 2026-12-01), which lowers the count.
      del dies
      made = [[i] for i in range(10_000)]
    assert gc.get_freeze_count() == 0 and gc_pause._interpreter_frozen == 0
    ids = {id(x) for x in made}
    assert sum(id(o) in ids for o in gc.get_objects(generation=2)) == len(made)
  finally:
    gc.unfreeze()

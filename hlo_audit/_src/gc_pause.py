"""Pausing Python's cyclic garbage collector around large, acyclic builds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
  """Runs the body with the cyclic collector off (restored after).

  Parsing a dump and auditing it allocate hundreds of thousands of objects
  that stay alive (the IR, the analyses' tables) and form no reference
  cycles. The collector, triggered by allocation counts, would traverse the
  growing heap again and again for nothing: a third of the audit of a large
  module. Memory is still freed by reference counting.

  On the way out, everything the body allocated is moved to the oldest
  generation (`freeze` then `unfreeze`, which splice lists without visiting
  objects); otherwise the first young collection after the pause would still
  visit all of it (a tenth of a large parse). Cycles made meanwhile are
  collected by the next full collection instead of the next young one. (Not
  done when the process has frozen objects of its own, e.g. before a fork.)
  """
  if not gc.isenabled():  # the caller manages the collector: leave it be
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    if gc.get_freeze_count() == 0:  # unfreeze would thaw someone's freeze
      gc.freeze()
      gc.unfreeze()
    gc.enable()

"""Pausing Python's cyclic garbage collector around large, acyclic builds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from hlo_audit._src import compat

#: Frozen objects that are the interpreter's own, not the program's (until the
#: first pause thaws them).
_interpreter_frozen = compat.INTERPRETER_FROZEN_AT_START


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
  collected by the next full collection instead of the next young one. Not
  done when the program has frozen objects of its own (e.g. before a fork):
  `unfreeze` would thaw them. The few hundred objects CPython 3.12 freezes at
  start-up (`compat.INTERPRETER_FROZEN_AT_START`) are not the program's, nor
  is whatever `unfreeze` leaves frozen, nor what is left of either once some
  of those objects died: the step works there too.
  """
  global _interpreter_frozen
  if not gc.isenabled():  # the caller manages the collector: leave it be
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    # On 3.12 the start-up count comes back by itself (importing jax after a
    # pause shows 375 again, with no freeze called): that count is the
    # interpreter's too. A frozen object that dies leaves the count, so the
    # interpreter's share is anything up to its last count; a program's own
    # freeze takes its whole heap, far more.
    if gc.get_freeze_count() <= max(_interpreter_frozen,
                                    compat.INTERPRETER_FROZEN_AT_START):
      gc.freeze()
      gc.unfreeze()
      # What `unfreeze` cannot thaw stays the interpreter's: CPython 3.12's
      # start-up objects survive it (the count is 375 again right after), so
      # resetting to 0 here would skip the step on every later pause.
      _interpreter_frozen = gc.get_freeze_count()
    gc.enable()

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
  module. Memory is still freed by reference counting; any cycle made inside
  is collected once the collector runs again.
  """
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()

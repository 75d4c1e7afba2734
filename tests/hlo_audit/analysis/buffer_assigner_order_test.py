"""The buffer assigner's order for a buffer of several values (a loop's
state, a conditional's outputs), as XLA's BufferAssigner has it: the
allocations its values' operands hold come first, value by value in member
order, and the first that fits wins; only when none does, the newest free
allocation. On the assigner itself, with tables and ranges spelled out."""

from __future__ import annotations

import types

from hlo_audit._src.analysis.liveness import _assign


class _AnyOrder:
  def can_follow(self, operand, user) -> bool:  # pylint: disable=unused-argument
    return True


def _placed(tops: dict) -> dict:
  """x and y: live-out buffers of 8 bytes over steps 0-1 (allocations 0 and
  1); then one buffer of values a and b over steps 2-3, whose operands are
  `tops`."""
  tables = types.SimpleNamespace(model=types.SimpleNamespace(temporaries_share_outputs=True),
                                 tops=tops, tops_of=lambda v: [])
  x, y, a, b = ("x", ()), ("y", ()), ("a", ()), ("b", ())
  placing = [(x, (x,), 8, False, True), (y, (y,), 8, False, True), (a, (a, b), 8, False, True)]
  ranges = {x: (0, 1), y: (0, 1), a: (2, 3), b: (2, 3)}
  allocation_of, sizes, heap = _assign(tables, placing, ranges, _AnyOrder())
  assert sizes == [8, 8] and heap == []
  return allocation_of


def test_a_later_value_s_operand_is_asked_when_the_first_value_s_offers_none():
  # a reads nothing reusable; b reads x: x's allocation, not the newest free (y's).
  assert _placed({"a": [], "b": [("x", ())]})[("a", ())] == 0


def test_the_first_value_s_operand_wins_over_a_later_one_s():
  # a reads y (allocation 1), b reads x (allocation 0): a's, asked first;
  # and the other way round (allocation 0 is found as much as any other).
  assert _placed({"a": [("y", ())], "b": [("x", ())]})[("a", ())] == 1
  assert _placed({"a": [("x", ())], "b": [("y", ())]})[("a", ())] == 0


def test_with_no_operand_allocation_the_newest_free_one_is_taken():
  assert _placed({"a": [], "b": []})[("a", ())] == 1

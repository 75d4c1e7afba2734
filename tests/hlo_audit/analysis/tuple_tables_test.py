"""Tuple values' pointer tables on hand-written scheduled HLO."""

from __future__ import annotations

import hlo_audit
from hlo_audit._src.analysis.schedule import flatten_schedule
from hlo_audit._src.analysis.tuple_tables import POINTER_BYTES, tuple_tables

# A tuple nested in a tuple (XLA:GPU's all-reduce start holds its operands so:
# ((operands), result)). %g takes out the inner tuple, %e an element of it.
NESTED = """
HloModule nested, is_scheduled=true
ENTRY %main (x: f32[8], y: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %y = f32[8]{0} parameter(1)
  %a = f32[8]{0} negate(%x)
  %b = f32[8]{0} negate(%y)
  %in = (f32[8]{0}, f32[8]{0}) tuple(%a, %b)
  %out = ((f32[8]{0}, f32[8]{0}), f32[8]{0}) tuple(%in, %a)
  %g = (f32[8]{0}, f32[8]{0}) get-tuple-element(%out), index=0
  %e = f32[8]{0} get-tuple-element(%g), index=1
  %c = f32[8]{0} add(%e, %a)
  ROOT %r = f32[8]{0} negate(%c)
}
"""


def test_a_get_tuple_element_of_a_nested_tuple_hands_on_its_table():
  module = hlo_audit.parse_hlo(NESTED)
  schedule = flatten_schedule(module)
  comps = {name: module.computation(name) for name in schedule.span}
  tables = {t.value: t for t in tuple_tables(module, schedule, comps, {})}
  # Two tables: the inner tuple's and the outer one's. %g makes none: it
  # is the inner tuple's table, which the outer one points to.
  assert set(tables) == {("in", ()), ("out", ())}
  assert tables[("in", ())].size == tables[("out", ())].size == 2 * POINTER_BYTES
  time = schedule.time
  # %g reads the outer table; %e reads the inner one through %g.
  assert tables[("out", ())].end == time["g"]
  assert tables[("in", ())].start == time["in"]
  assert tables[("in", ())].end == time["e"]

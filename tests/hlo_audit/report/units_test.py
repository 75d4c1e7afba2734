"""The report's units: times written to three figures in the largest unit
and read back, a source line with the library frame it called into."""

from __future__ import annotations

import math
import re

import pytest

from hlo_audit._src.hlo.ir import SourceLocation
from hlo_audit._src.report.units import fmt_source_context, fmt_time, parse_time


@pytest.mark.parametrize("seconds, text", [
    (1.23e-5, "12.3 us"), (1.25e-3, "1.25 ms"), (2, "2.00 s"), (8.5e-7, "850 ns"),
    (0.5, "500 ms"), (9.996e-6, "10.0 us"), (999.96e-6, "1.00 ms"),
    (-3e-6, "-3.00 us"), (0, "0 s"), (None, "n/a"),
    # Exactly at the digits' thresholds (99.95 and 9.995 are these floats).
    (99.95, "100 s"), (9.995, "10.0 s")])
def test_fmt_time_keeps_three_figures_in_the_largest_unit(seconds, text):
  assert fmt_time(seconds) == text


@pytest.mark.parametrize("text, seconds", [
    ("5us", 5e-6), ("1.5ms", 1.5e-3), ("2s", 2.0), ("850 ns", 8.5e-7),
    ("5\u00b5s", 5e-6), (" 3 MS ", 3e-3), ("1e-3", 1e-3), (".5ms", 5e-4), (2e-6, 2e-6),
    (3, 3.0)])
def test_parse_time_reads_numbers_and_units(text, seconds):
  assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["5 mins", "-1us", "fast", "", "1e999", -1e-6,
                                  math.nan, True])
def test_parse_time_names_the_bad_text(text):
  with pytest.raises(ValueError, match="^" + re.escape(repr(text)) + " is not a time: expected"):
    parse_time(text)


def test_a_source_line_names_the_library_frame_it_called_into_when_there_is_one():
  user = SourceLocation("model.py", 27, function="f")
  flax = SourceLocation("/site-packages/flax/linen/linear.py", 422, function="Dense.__call__")
  assert fmt_source_context(user, (flax, user)) == \
      "model.py:27 (in flax Dense.__call__ at flax/linen/linear.py:422)"
  # The user's own frame innermost: the line alone, no empty "()".
  assert fmt_source_context(user, (user,)) == "model.py:27"
  assert fmt_source_context(None, (flax,)) == ""

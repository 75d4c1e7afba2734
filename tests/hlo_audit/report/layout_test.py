"""Text layout, finding groups and the terminal report's width rules."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
import types

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.examples.transformer import TransformerConfig, example
from hlo_audit._src.hlo.ir import SourceLocation
from hlo_audit._src.report import layout
from hlo_audit._src.report.grouping import group_findings, ranked_groups
from hlo_audit._src.report.layout import Column
from hlo_audit._src.report.memory_view import stack_buffers
from hlo_audit._src.report.units import fmt_delta_bytes, openable_path, parse_bytes, parse_time

@functools.cache
def example_report():
  cfg = TransformerConfig(batch=2, seq=32, d_model=64, heads=2, d_ff=128, vocab=128, layers=2)
  fn, args = example(cfg)
  return hlo_audit.audit(fn, *args)


def test_wrap_indents_the_lines_after_the_first():
  assert layout.wrap("aaa bbb ccc", 8, indent="  ") == ["aaa bbb", "  ccc"]
  # A line exactly as wide as the width is full, not over.
  assert layout.wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]


def test_elide_keeps_both_ends_and_wrap_never_splits_words():
  assert layout.elide("copy_bitcast_fusion.15", 12) == "copy_b…on.15"
  assert layout.elide("short", 12) == "short"
  lines = layout.wrap("a fusion named broadcast_multiply_fusion.4 reads it", 20, indent="  ")
  assert all(len(l) <= 20 for l in lines)
  assert "broadcast_multiply_fusion.4" not in " ".join(lines)  # too long: elided whole
  assert any("broadcast" in l and "…" in l for l in lines)


def test_table_moves_the_source_under_the_row_instead_of_breaking_it():
  cols = (Column("#", "num"), Column("name", "name"), Column("note", "text"),
          Column("extra", "text", optional=True), Column("source", "source"))
  rows = [("1", "copy_bitcast_fusion.15", "a long note that wraps at spaces", "x" * 30,
           "hlo_audit/_src/examples/transformer.py:93")]
  wide = layout.table(cols, rows, 160)
  assert len(wide) == 2 and wide[1].endswith("transformer.py:93") and "x" * 30 in wide[1]
  narrow = layout.table(cols, rows, 60)
  assert all(len(l) <= 60 for l in narrow)
  assert "extra" not in narrow[0]                       # optional column dropped first
  assert narrow[-1].strip() == "hlo_audit/_src/examples/transformer.py:93"


def test_groups_merge_the_same_pattern_at_one_line_and_rank_by_time():
  r = example_report()
  groups = ranked_groups(r.findings)
  assert sum(g.count for g in groups) == len(r.findings)
  assert len(groups) < len(r.findings)                  # two layers: repeats merge
  act = [g for g in groups if g.actionable]
  # Ranked by the estimated time saved; by peak, then traffic, on request.
  times = [g.time_saved for g in act]
  assert None not in times
  ps = [round(t * 1e12) for t in times]  # ranked in whole picoseconds
  assert ps == sorted(ps, reverse=True)
  by_peak = [g for g in ranked_groups(r.findings, "peak") if g.actionable]
  keys = [(g.peak_saved or 0, round(g.time_saved * 1e12)) for g in by_peak]
  assert keys == sorted(keys, reverse=True)
  by_bytes = [g.bytes_saved for g in ranked_groups(r.findings, "bytes") if g.actionable]
  assert by_bytes == sorted(by_bytes, reverse=True)
  assert all(not g.actionable for g in groups[len(act):])
  for g in groups:
    assert len({(f.kind, f.boundary_shape, f.ops, f.source.line if f.source else None)
                for f in g.members}) == 1
  # Another analysis's savings rank a group first under their own sort.
  @dataclasses.dataclass(frozen=True)
  class Boosted:
    f: object
    peak_saved: int | None
    time_saved: float | None

    def __getattr__(self, name):
      return getattr(self.f, name)

  small = act[-1].first
  boosted = [Boosted(f, 10 ** 9 if f is small else None,
                     1.0 if f is small else f.time_saved) for f in r.findings]
  assert ranked_groups(boosted)[0].first.f is small
  assert ranked_groups(boosted, "peak")[0].first.f is small
  unpriced = [Boosted(f, f.peak_saved, None) for f in r.findings]
  # Without an estimate (an unknown device) the traffic ranks.
  by_traffic = [g.bytes_saved for g in ranked_groups(unpriced) if g.actionable]
  assert by_traffic == sorted(by_traffic, reverse=True)
  assert group_findings(r.findings) == group_findings(r.findings)


def test_default_report_fits_a_screen_and_never_breaks_a_name():
  r = example_report()
  for width in (80, 100, 160):
    text = r.to_text(width)
    lines = text.splitlines()
    assert all(len(l) <= width for l in lines), width
    assert len(lines) <= 70 if width == 80 else len(lines) <= 60
    assert "Top " in text and "Next:" in text and "to_text(all=True)" in text
    # Every file:line appears whole on one line.
    srcs = {f"{openable_path(f.source.file, os.getcwd())}:{f.source.line}"
            for f in r.findings if f.source}
    shown = set(re.findall(r"\S+\.py:\d+", text))
    assert shown and shown <= srcs
  full = r.to_text(80, all=True)
  assert all(len(l) <= 80 for l in full.splitlines())
  assert "Intermediate tensors" in full and "Findings (fusion decision records)" in full
  # Names are never cut into pieces across lines (as rich's folding did:
  # "multipl" / "y_add_f" / "usion"), and from 80 columns up never elided.
  names = ({k.name for k in r.kernels} | {b.name for b in r.buffers}
           | {k.detail for k in r.kernels})
  narrow = r.to_text(60, all=True)
  for text in (full, r.to_text(80), narrow):
    for tok in text.split():
      tok = tok.strip(",;()")
      assert not tok.endswith("_") and not (tok.startswith("_") and tok not in names), tok
  assert "…" in narrow                                  # under 80, names are elided


def test_names_stay_whole_from_80_columns_up():
  r = example_report()
  kernels = {k.name for k in r.kernels}
  for width in (80, 91, 120):
    full = r.to_text(width, all=True)
    for text in (full, r.to_text(width)):
      assert "…" not in text, width
      assert all(len(line) <= width for line in text.splitlines()), width
    tokens = {t.strip(",;()") for t in full.split()}
    assert kernels <= tokens, sorted(kernels - tokens)[:5]  # every kernel listed whole


def test_a_name_too_long_for_its_column_gets_a_line_above_its_row():
  cols = (Column("Name", "name", min_width=4), Column("Size", "num"),
          Column("What", "text", min_width=4))
  rows = [("a_rather_long_kernel_name.12", "1.00 MiB", "unfused epilogue"),
          ("short", "2 B", "keep")]
  lines = layout.table(cols, rows, 80)
  assert lines[1].startswith("  a_rather_long_kernel_name.12") and len(lines) == 3
  squeezed = layout.table(cols, [(rows[0][0] * 3, "1 B", "x")], 80)
  assert squeezed[1].strip() == rows[0][0] * 3         # whole, on its own line
  assert squeezed[2].split() == ["1", "B", "x"]        # the row, its name cell blank
  assert "…" in layout.table(cols, [(rows[0][0] * 3, "1 B", "x")], 60)[1]


def test_source_paths_are_the_ones_a_user_opens(tmp_path, monkeypatch):
  pkg = tmp_path / "site" / "mypkg" / "sub"
  pkg.mkdir(parents=True)
  (tmp_path / "site" / "mypkg" / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("")
  f = str(pkg / "model.py")
  assert openable_path(f, str(tmp_path)) == os.path.join("site", "mypkg", "sub", "model.py")
  assert openable_path(f, "/elsewhere") == os.path.join("mypkg", "sub", "model.py")
  loose = str(tmp_path / "script.py")
  assert openable_path(loose, "/elsewhere") == loose
  assert openable_path("relative/x.py", "/elsewhere") == "relative/x.py"
  loc = example_report().findings[0].source
  monkeypatch.chdir(tmp_path)
  assert hlo_audit.Shape  # package importable from anywhere
  from hlo_audit._src.report.units import fmt_source
  assert fmt_source(loc) == f"hlo_audit/_src/examples/transformer.py:{loc.line}"
  assert fmt_source(SourceLocation("/x/y.py", 3)) == "/x/y.py:3"
  # A relative path is the user's own, kept as written, even where it
  # names a package below this folder.
  assert openable_path("site/mypkg/sub/model.py", "/elsewhere") == "site/mypkg/sub/model.py"
  assert openable_path("./site/mypkg/../mypkg/sub/model.py", "/elsewhere") == (
      "./site/mypkg/../mypkg/sub/model.py")


def test_bytes_change_unit_at_1024():
  from hlo_audit._src.report.units import fmt_bytes  # pylint: disable=import-outside-toplevel
  assert (fmt_bytes(1023), fmt_bytes(1024), fmt_bytes(-1024)) == ("1023 B", "1.00 KiB",
                                                                   "-1.00 KiB")
  assert fmt_bytes(2 ** 20) == "1.00 MiB" and fmt_bytes(2 ** 50) == "1024.00 TiB"


def test_parse_bytes():
  assert parse_bytes("1MiB") == 2 ** 20 and parse_bytes("1.5 KiB") == 1536
  assert parse_bytes("2GB") == 2 * 10 ** 9 and parse_bytes("4096") == 4096
  with pytest.raises(ValueError, match="not a size"):
    parse_bytes("lots")


def test_a_change_in_bytes_is_signed_only_when_it_is_not_zero():
  assert [fmt_delta_bytes(n) for n in (1536, -1536, 0)] == ["+1.50 KiB", "-1.50 KiB", "0 B"]


def test_parse_time_takes_no_negative_number():
  assert parse_time("1.5ms") == 1.5e-3 and parse_time(2) == 2.0
  for bad in (-1, -0.5, float("inf"), "lots"):
    with pytest.raises(ValueError, match="not a time"):
      parse_time(bad)


def test_stacked_bands_never_overlap_while_both_are_live():
  r = example_report()
  lay = stack_buffers(r.buffers)
  bands = lay.bands
  for i, a in enumerate(bands):
    for b in bands[i + 1:]:
      (a0, a1), (b0, b1) = a.buffer.live_range, b.buffer.live_range
      if a0 <= b1 and b0 <= a1:
        assert (a.offset + a.buffer.bytes <= b.offset or
                b.offset + b.buffer.bytes <= a.offset), (a.buffer.name, b.buffer.name)
  assert lay.height >= max(sum(x.buffer.bytes for x in bands
                               if x.buffer.live_range[0] <= t <= x.buffer.live_range[1])
                           for t in range(len(r.timeline)))
  few = stack_buffers(r.buffers, max_bands=10)
  assert len(few.bands) == 10 and few.omitted == len(bands) - 10
  assert min(b.buffer.bytes for b in few.bands) >= max(
      b.bytes for b in r.buffers if not b.internal and b.bytes > 0
      and b.name not in {x.buffer.name for x in few.bands})


def _first_fit(buffers) -> list[int]:
  """The definition `stack_buffers` implements, walked naively: in order of
  start (largest first), the lowest offset where the band overlaps no band
  placed before it that is still live at its start."""
  placed: list[tuple[int, int, int]] = []  # (offset, high, last step)
  out = []
  for b in sorted(buffers, key=lambda b: (b.live_range[0], -b.bytes)):
    start, end = b.live_range
    taken = sorted((lo, hi) for lo, hi, last in placed if last >= start)
    offset = 0
    for lo, hi in taken:
      if lo - offset >= b.bytes:
        break
      offset = max(offset, hi)
    placed.append((offset, offset + b.bytes, end))
    out.append(offset)
  return out


def test_stacked_bands_are_first_fit():
  """The gap list (merged as bands retire) places every band where the
  naive first-fit walk does: on the example, and on random bands made to
  leave many gaps."""
  rng = random.Random(0)
  made = []
  for i in range(600):
    s = rng.randrange(300)
    made.append(types.SimpleNamespace(
        name=f"b{i}", internal=False, bytes=rng.choice([1, 2, 3, 5, 8, 64]),
        live_range=(s, s + rng.choice([0, 1, 5, 40, 300]))))
  for buffers in (list(example_report().buffers), made):
    lay = stack_buffers(buffers)
    drawn = [b.buffer for b in lay.bands]
    assert len(drawn) > 200
    assert [b.offset for b in lay.bands] == _first_fit(drawn)
    assert lay.height == max(b.offset + b.buffer.bytes for b in lay.bands)


def test_table_drops_the_optional_column_with_the_higher_drop_first_before_the_other():
  # The terminal's "Scratch" (drop_first=2) goes before "On chip" (1): a
  # width that leaves room for one of the two keeps the lower one.
  cols = (Column("name", "name"), Column("On chip", "num", optional=True, drop_first=1),
          Column("Scratch", "num", optional=True, drop_first=2))
  rows = [("fusion.1", "12.0 MiB", "3.0 MiB")]
  both = layout.table(cols, rows, 200)
  assert "On chip" in both[0] and "Scratch" in both[0]
  one = len(both[0]) - 3
  assert one < len(both[0])
  kept = layout.table(cols, rows, one)
  assert "On chip" in kept[0] and "Scratch" not in kept[0]
  # Left to right among equals: the first of two equal columns goes first.
  same = (cols[0], dataclasses.replace(cols[1], drop_first=0),
          dataclasses.replace(cols[2], drop_first=0))
  kept = layout.table(same, rows, one)
  assert "Scratch" in kept[0] and "On chip" not in kept[0]

"""The mutation bench's own mutator: each operator makes the slip it names,
one edit at one line, and never a mutant the interpreter cannot tell apart."""

from __future__ import annotations

import ast
import textwrap

import pytest

from scripts import bench_mutation as bm


def _made(source: str, operator: str) -> list[tuple[str, str]]:
  """(before, after) of each mutant the operator makes, stripped."""
  source = textwrap.dedent(source)
  return [(m.before.strip(), m.after.strip()) for m in bm.mutants(source)
          if m.operator == operator]


def test_swap_args_swaps_neighbouring_positional_arguments():
  made = _made("""
      def f(a, b):
        return g(a, b, key=1)
      """, "swap_args")
  assert made == [("return g(a, b, key=1)", "return g(b, a, key=1)")]


def test_swap_args_leaves_symmetric_calls_alone():
  assert _made("x = max(a, b) + min(c, d)\n", "swap_args") == []


def test_swap_compare_swaps_an_ordering_comparison():
  assert _made("ok = lo < hi\n", "swap_compare") == [("ok = lo < hi", "ok = hi < lo")]
  assert _made("same = a == b\n", "swap_compare") == []  # symmetric: no slip


def test_boundary_moves_each_comparison_of_a_chain():
  made = _made("ok = 0 <= i < n\n", "boundary")
  assert made == [("ok = 0 <= i < n", "ok = 0 < i < n"), ("ok = 0 <= i < n", "ok = 0 <= i <= n")]
  assert _made("big = x >= y\n", "boundary") == [("big = x >= y", "big = x > y")]


def test_neighbour_name_reads_a_nearby_local_bound_before():
  made = _made("""
      def f(rows: int, cols: int, data: str):
        total = rows * 2
        return total + cols
      """, "neighbour_name")
  # `data` is annotated otherwise; `total` is unbound where `rows` is read.
  assert ("total = rows * 2", "total = cols * 2") in made
  assert ("return total + cols", "return cols + cols") in made  # cols is nearest
  assert all("data" not in after for _, after in made)
  assert all(not after.startswith("total = total") for _, after in made)


def test_neighbour_name_keeps_functions_for_functions():
  made = _made("""
      def f(xs, fn):
        n = len(xs)
        return fn(n)
      """, "neighbour_name")
  assert made and all(not after.startswith("return xs(") and "fn(fn)" not in after
                      and not after.endswith("(fn)") for _, after in made)


def test_drop_term_drops_each_term_of_a_guard():
  made = _made("""
      if a and (b or c):
        pass
      """, "drop_term")
  before = "if a and (b or c):"
  assert made == [(before, "if (b or c):"), (before, "if a and (b):"), (before, "if a and (c):"),
                  (before, "if a:")]


def test_drop_term_only_in_guards():
  assert _made("x = a and b\n", "drop_term") == []


def test_any_all_swaps_both_ways_and_methods():
  assert _made("ok = any(xs)\n", "any_all") == [("ok = any(xs)", "ok = all(xs)")]
  assert _made("ok = jnp.all(xs)\n", "any_all") == [("ok = jnp.all(xs)", "ok = jnp.any(xs)")]


def test_sort_order_drops_the_minus_and_toggles_reverse():
  made = _made("ys = sorted(xs, key=lambda x: (-x.size, x.name))\n", "sort_order")
  assert made == [
      ("ys = sorted(xs, key=lambda x: (-x.size, x.name))",
       "ys = sorted(xs, key=lambda x: (-x.size, x.name), reverse=True)"),
      ("ys = sorted(xs, key=lambda x: (-x.size, x.name))",
       "ys = sorted(xs, key=lambda x: (x.size, x.name))")]
  assert _made("xs.sort(reverse=True)\n", "sort_order") == [
      ("xs.sort(reverse=True)", "xs.sort(reverse=False)")]


def test_get_default_changes_the_default():
  assert _made("n = d.get('k', 0)\n", "get_default") == [("n = d.get('k', 0)", "n = d.get('k', 1)")]
  assert _made("n = d.get('k', ())\n", "get_default") == [
      ("n = d.get('k', ())", "n = d.get('k', None)")]
  assert _made("n = d.get('k')\n", "get_default") == []


def test_dict_key_reads_the_nearest_other_key_of_the_same_mapping():
  made = _made("""
      def f(cfg, other):
        m = cfg["block_m"]
        n = cfg.get("block_n", 8)
        return m, n, other["block_k"]
      """, "dict_key")
  assert made == [('m = cfg["block_m"]', 'm = cfg["block_n"]'),
                  ('n = cfg.get("block_n", 8)', 'n = cfg.get("block_m", 8)')]


def test_annotations_are_never_mutated():
  src = """
      from __future__ import annotations
      def f(a: dict[str, int], b: dict[str, int]) -> tuple[int, int]:
        return a, b
      """
  assert all(m.line != 3 for m in bm.mutants(textwrap.dedent(src)))


_SAMPLE = """
def pick(items, limit, floor=0):
  out = []
  for i, x in enumerate(items):
    if x.size >= floor and (x.name or i < limit) and not any(x.flags):
      out.append(x.meta.get("rank", 0))
  keep = sorted(out, key=lambda r: -r)
  return max(keep[0], limit), min(i, limit) < len(out), all(k > 0 for k in keep)
"""


def test_every_mutant_is_one_line_and_no_op_free():
  made = bm.mutants(_SAMPLE, "m.py")
  assert {m.operator for m in made} >= set(bm.OPERATORS) - {"dict_key"}
  original = ast.dump(ast.parse(_SAMPLE))
  dumps = set()
  for m in made:
    new = m.apply(_SAMPLE)
    changed = [i for i, (a, b) in enumerate(zip(_SAMPLE.splitlines(), new.splitlines())) if a != b]
    assert changed == [m.line - 1], m.describe()
    dump = ast.dump(ast.parse(new))
    assert dump != original, m.describe()
    dumps.add(dump)
  assert len(dumps) == len(made)  # no two mutants alike
  assert len({m.id for m in made}) == len(made)


def test_apply_refuses_a_line_that_moved():
  m = bm.mutants("ok = a < b\n")[0]
  with pytest.raises(ValueError):
    m.apply("x = 1\nok = a < b\n")


def test_sample_spans_the_operators_and_is_seeded():
  made = bm.mutants(_SAMPLE, "m.py")
  ops = {m.operator for m in made}
  picked = bm.sample(made, len(ops), seed=3)
  assert {m.operator for m in picked} == ops
  assert picked == bm.sample(made, len(ops), seed=3)
  assert bm.sample(made, 0, seed=3) == made


def test_wilson_interval():
  lo, hi = bm.wilson(6, 14)
  assert 0.2 < lo < 0.43 < hi < 0.7
  assert bm.wilson(0, 0) == (0.0, 1.0)


def test_config_names_every_package_folder():
  folders, _ = bm.load_config()
  assert {"hlo", "capture", "analysis", "report", "sweep", "cli", "testing", "ops", "swap",
          "validate", "audit"} <= set(folders)
  for f in folders.values():
    assert bm.source_files(f), f.name


# -- which tests run a line ----------------------------------------------------

_STATEMENTS = """\
import functools


@functools.cache
def f(a,
      b):
  if (a <
      b):
    return [x
            for x in range(a)]
  return b
"""


def test_a_line_belongs_to_its_innermost_statement_and_a_header_to_its_own():
  lines = bm.statement_lines(_STATEMENTS)
  assert lines[1] == (1, 1)
  # The decorator and the signature are the def's header; its body is not.
  assert lines[4] == lines[5] == lines[6] == (4, 6)
  assert lines[7] == lines[8] == (7, 8)  # the if's condition, not its body
  assert lines[9] == lines[10] == (9, 10)
  assert lines[11] == (11, 11)


def test_a_mutant_is_run_by_the_tests_of_any_line_of_its_statement():
  reach = bm.Reach(
      lines={"m.py": {7: frozenset({"t.py::a"}), 9: frozenset({"t.py::b"}),
                      10: frozenset({"t.py::c"}), 11: frozenset({""})}},
      statements={"m.py": bm.statement_lines(_STATEMENTS)})

  def tests(line):
    return reach.tests_of(bm.Mutant("m.py", line, "boundary", 0, "", ""))

  assert tests(8) == {"t.py::a"}  # the tracer filed the condition under line 7
  assert tests(10) == {"t.py::b", "t.py::c"}
  assert tests(11) == {""}
  assert tests(5) == frozenset()  # a header nothing ran
  assert bm.Reach({}, {}).tests_of(bm.Mutant("other.py", 3, "boundary", 0, "", "")) == set()


_MODULE = """\
def smaller(a, b):
  return a < b


def larger(a, b):
  return a > b


def unused(a, b):
  return a >= b
"""

_TESTS = """\
from pkg import m


def test_smaller():
  assert m.smaller(1, 2) and not m.smaller(2, 2)


def test_larger_loosely():
  assert m.larger(3, 2)
"""


def test_the_line_s_own_tests_kill_and_the_whole_folder_judges_the_rest(tmp_path):
  pytest.importorskip("coverage")
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "m.py").write_text(_MODULE)
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "m_test.py").write_text(_TESTS)
  folder = bm.Folder("f", ("pkg",), ("tests",))
  cov = tmp_path / "cov"
  cov.mkdir()
  code, _, tail = bm._pytest(str(tmp_path), folder, 120, coverage_dir=str(cov))
  assert code == 0, tail
  reach = bm.Reach.read(str(cov / "coverage.db"), str(tmp_path), ["pkg/m.py"])
  assert reach.lines["pkg/m.py"][2] == {"tests/m_test.py::test_smaller"}
  assert reach.lines["pkg/m.py"][6] == {"tests/m_test.py::test_larger_loosely"}
  assert "" in reach.lines["pkg/m.py"][1]  # the def runs at import, outside any test

  made = {m.line: m for m in bm.mutants(_MODULE, "pkg/m.py") if m.operator == "boundary"}
  killed = bm.judge(str(tmp_path), folder, made[2], 120, reach)
  assert (killed["status"], killed["tests_run"]) == ("killed", 1)
  survived = bm.judge(str(tmp_path), folder, made[6], 120, reach)
  assert (survived["status"], survived["tests_run"], survived["reached"]) == (
      "survived", "all", True)
  # A quick look leaves the survivor to the line's own tests.
  quick = bm.judge(str(tmp_path), folder, made[6], 120, reach, confirm=False)
  assert (quick["status"], quick["tests_run"]) == ("survived", 1)
  # A line no test runs in pytest's process (a subprocess's perhaps): the whole folder.
  unreached = bm.judge(str(tmp_path), folder, made[10], 120, reach)
  assert (unreached["status"], unreached["tests_run"], unreached["reached"]) == (
      "survived", "all", False)
  assert (tmp_path / "pkg" / "m.py").read_text() == _MODULE

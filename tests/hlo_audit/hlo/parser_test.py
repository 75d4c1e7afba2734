"""The HLO text parser: everything CPU, GPU and TPU backends print parses,
the fast and slow paths agree, and malformed text raises `HloParseError`
with the line and column XLA reports (and nothing else escapes)."""

from __future__ import annotations

import hlo_snippets
import pytest

import hlo_audit
from hlo_audit import HloParseError, parse_hlo, parse_shape
from hlo_audit._src.hlo import grammar
from hlo_audit._src.hlo.parser import _parse


def structure(module) -> list:
  """[[computation, [[instruction, opcode], ...]], ...], as xla_reference."""
  return [[c.name, [[i.name, i.opcode] for i in c.instructions]]
          for c in module.computations]


def both_paths(text: str):
  """The module from the fast path, checked equal to the slow path's."""
  fast = _parse(text, None, fast=True)
  slow = _parse(text, None, fast=False)
  assert fast == slow
  return fast


def module_with(*lines: str) -> str:
  """A module whose entry has `p` (f32[4]) and then `lines`."""
  body = "".join(f"  {line}\n" for line in lines)
  return f"HloModule m\n\nENTRY e {{\n  p = f32[4] parameter(0)\n{body}}}\n"


# ------------------------------------------------------ snippets vs XLA ----


@pytest.mark.parametrize("name", sorted(hlo_snippets.ALL))
def test_fast_and_slow_paths_agree_on_snippets(name):
  """`_parse(fast=True) == _parse(fast=False)` for every snippet."""
  both_paths(hlo_snippets.ALL[name])


def test_snippets_match_xla(tmp_path):
  """XLA's parser (live, via xla_reference) accepts every snippet and names
  the same computations and instructions with the same opcodes."""
  pytest.importorskip("jaxlib._hlo")
  import xla_reference  # noqa: PLC0415
  paths = {}
  for name, text in hlo_snippets.ALL.items():
    path = tmp_path / f"{name}.hlo"
    path.write_bytes(text.encode())
    paths[str(path)] = name
  mismatches = []
  results = list(xla_reference.parse_with_xla(paths))
  assert len(results) == len(paths)
  for result in results:
    name = paths[result["path"]]
    if not result["ok"]:
      mismatches.append(f"{name}: XLA rejects it: {result.get('error')}")
      continue
    ours = structure(parse_hlo(hlo_snippets.ALL[name]))
    if ours != result["computations"]:
      mismatches.append(f"{name}: ours {ours}\n  XLA {result['computations']}")
  assert not mismatches, "\n".join(mismatches)


def test_an_operand_naming_nothing_is_dropped_where_the_list_closes():
  # XLA accepts DROPPED_OPERAND (test_snippets_match_xla holds it); where the
  # list does not close after it, the undefined name is the error.
  assert both_paths(hlo_snippets.DROPPED_OPERAND).entry.root.operands == ("p",)
  bad = hlo_snippets.DROPPED_OPERAND.replace("f32[4] negate", "q")
  with pytest.raises(HloParseError, match="operand q is not defined"):
    parse_hlo(bad)


# ------------------------------------------------- what backends print ----


def test_scheduled_gpu_module():
  m = both_paths(hlo_snippets.SCHEDULED_ASYNC)
  assert m.is_scheduled
  assert structure(m)[3] == ["main", [
      ["a", "parameter"], ["b", "parameter"], ["ars", "all-reduce-start"],
      ["ard", "all-reduce-done"], ["as", "async-start"], ["ad", "async-done"],
      ["ccs", "async-start"], ["ccd", "async-done"], ["m", "multiply"],
      ["t", "tuple"]]]
  # `/*index=5*/` before an operand is a comment.
  assert m.entry.root.operands == ("ard", "ad", "ccd", "m", "a", "b")
  assert len(m.entry.root.shape.tuple_shapes) == 6


def test_async_start_forms():
  """all-gather-start/done are opcodes of their own; `X-start` for other X
  is async-start wrapping X; `X-update` likewise."""
  m = both_paths(module_with(
      "ags = (f32[4], f32[8]) all-gather-start(p), dimensions={0}, replica_groups={{0,1}}",
      "agd = f32[8] all-gather-done(ags)",
      "cps = (f32[4], f32[4], u32[], u32[]) collective-permute-start(p), source_target_pairs={{0,1}}",
      "cpd = f32[4] collective-permute-done(cps)",
      "ROOT t = (f32[8], f32[4]) tuple(agd, cpd)"))
  e = m.entry
  assert [i.opcode for i in e.instructions][1:5] == [
      "all-gather-start", "all-gather-done", "collective-permute-start",
      "collective-permute-done"]
  assert all(i.async_wrapped_opcode is None for i in e.instructions)


def test_async_update():
  text = module_with(
      "s = ((f32[4]), f32[4], u32[]) custom-call-start(p), custom_call_target=\"k\"",
      "u = ((f32[4]), f32[4], u32[]) custom-call-update(s)",
      "ROOT d = f32[4] custom-call-done(u)")
  e = both_paths(text).entry
  assert [(i.opcode, i.async_wrapped_opcode) for i in e.instructions[1:]] == [
      ("async-start", "custom-call"), ("async-update", "custom-call"),
      ("async-done", "custom-call")]


def test_async_wrapped_names_are_uniquified():
  """Two custom-call-starts make `async_wrapped` and `async_wrapped.1`."""
  text = module_with(
      'st1 = ((f32[4]), f32[4], u32[]) custom-call-start(p), custom_call_target="a"',
      "d1 = f32[4] custom-call-done(st1)",
      'st2 = ((f32[4]), f32[4], u32[]) custom-call-start(d1), custom_call_target="b"',
      "ROOT d2 = f32[4] custom-call-done(st2)")
  m = both_paths(text)
  assert [c.name for c in m.computations] == ["async_wrapped", "async_wrapped.1", "e"]
  assert m.entry.instruction("st2").called_computations["calls"] == ("async_wrapped.1",)
  # The wrapped instructions are renamed module-wide too (as jaxlib reports).
  assert structure(m)[1][1] == [["async_param.1", "parameter"], ["custom-call.1", "custom-call"]]


def test_constants():
  m = both_paths(hlo_snippets.CONSTANTS)
  assert [i.opcode for i in m.entry.instructions] == ["constant"] * 6 + ["tuple"]


def test_multiline_constant():
  e = both_paths(module_with("c = f32[2,2] constant({", "  {1, 2},", "  {3, 4}", "})",
                             "ROOT r = f32[2,2] negate(c)")).entry
  assert e.instruction("c").literal.split() == ["{", "{1,", "2},", "{3,", "4}", "}"]


def test_tuple_literal_constant():
  e = both_paths(module_with("ROOT c = (f32[], s32[2]) constant((1.5, {1, 2}))")).entry
  assert e.root.literal == "(1.5, {1, 2})"


def test_control_predecessors():
  e = both_paths(module_with("a = f32[4] negate(p)", "b = f32[4] exponential(p)",
                             "ROOT c = f32[4] add(a, b), control-predecessors={b, a}")).entry
  assert e.root.control_predecessors == ("b", "a")
  assert "control-predecessors" not in e.root.attributes


def test_nested_instructions_and_inline_computation():
  """`add(f32[] maximum(a, b), c)`: XLA names the nested instruction
  `maximum.anon`; an inline `to_apply={...}` becomes computation `_`."""
  m = both_paths(hlo_snippets.NESTED)
  assert structure(m) == [
      ["_", [["x", "parameter"], ["y", "parameter"], ["s", "add"]]],
      ["main", [["a", "parameter"], ["b", "parameter"], ["c", "parameter"],
                ["maximum.anon", "maximum"], ["d", "add"], ["v", "parameter"],
                ["zero", "constant"], ["r", "reduce"]]]]
  assert m.entry.instruction("d").operands == ("maximum.anon", "c")
  assert m.entry.instruction("maximum.anon").operands == ("a", "b")
  assert m.entry.root.called_computations["to_apply"] == ("_",)


def test_omitted_shapes_are_inferred():
  e = both_paths(module_with(
      "a = negate(p)", "q = s32[] parameter(1)", "t = tuple(a, q)",
      "g = get-tuple-element(t), index=1", "c = compare(p, a), direction=LT",
      "ROOT r = f32[] constant(0)")).entry
  assert e.instruction("a").shape == parse_shape("f32[4]")
  assert e.instruction("t").shape == parse_shape("(f32[4], s32[])")
  assert e.instruction("g").shape == parse_shape("s32[]")
  assert e.instruction("c").shape == parse_shape("pred[4]")
  # Nested instructions without shapes: max(a, b) in NESTED is f32[].
  nested = parse_hlo(hlo_snippets.NESTED).entry
  assert nested.instruction("maximum.anon").shape == parse_shape("f32[]")
  assert nested.instruction("d").shape == parse_shape("f32[]")


@pytest.mark.parametrize("text, params", [
    ("ROOT r = f32[2] add(f32[2] x, f32[2] y)", [("x", "f32[2]"), ("y", "f32[2]")]),
    ("r = s32[] negate(s32[] v)", [("v", "s32[]")]),
    ("f32[3] exponential(f32[3] %in)", [("in", "f32[3]")]),
])
def test_single_instruction_texts(text, params):
  """A lone instruction: XLA turns its typed operands into parameters."""
  m = both_paths(text)
  (comp,) = m.computations
  assert [(p.name, str(p.shape)) for p in comp.parameters] == params
  assert [p.parameter_number for p in comp.parameters] == list(range(len(params)))
  assert comp.root is comp.instructions[-1]


def test_comments_anywhere():
  text = ("// leading comment\nHloModule m /* header */\n\n"
          "ENTRY e { // body\n  p = f32[4] /* shape */ parameter(0) // trailing\n"
          "  /* before */ ROOT r = f32[4] negate(/*op*/ p)\n}\n// end\n")
  assert structure(both_paths(text)) == [["e", [["p", "parameter"], ["r", "negate"]]]]


def test_crlf_and_cr_only_line_endings():
  """CRLF and bare CR parse to the same module as LF."""
  lf = parse_hlo(hlo_snippets.CONTROL_FLOW)
  assert both_paths(hlo_snippets.ALL["crlf"]) == lf
  assert both_paths(hlo_snippets.ALL["cr_only"]) == lf


def test_crlf_errors_count_lines():
  text = module_with("ROOT r = f32[4] frobnicate(p)").replace("\n", "\r\n")
  with pytest.raises(HloParseError) as e:
    parse_hlo(text)
  assert (e.value.line, e.value.column) == (5, 19)
  assert e.value.line_text == "  ROOT r = f32[4] frobnicate(p)"


def test_computation_execution_thread():
  m = both_paths("HloModule m\nf {\n  ROOT a = f32[] parameter(0)\n}, execution_thread=\"host\"\n"
                 "ENTRY e {\n  ROOT b = f32[] parameter(0)\n}\n")
  assert m.computation("f").execution_thread == "host"
  assert m.entry.execution_thread == "main"


def test_module_header_attributes_kept_raw():
  m = both_paths(hlo_snippets.ATTRIBUTES)
  assert m.attributes["input_output_alias"] == "{ {0}: (0, {}, may-alias), {1}: (1, {1}, must-alias) }"
  assert set(m.attributes) == {"input_output_alias", "entry_computation_layout"}


def test_names_are_uniquified_module_wide():
  """As XLA's uniquifier: later duplicates get .1, .2 (CONTROL_FLOW repeats
  `i`, `p` and `r`; XLA reports i.1, p.1, r.1)."""
  m = parse_hlo(hlo_snippets.CONTROL_FLOW)
  names = [i.name for _, i in m.instructions()]
  assert len(names) == len(set(names))
  assert m.computation("branch1").root_name == "r.1"
  assert m.computation("branch1").root.operands == ("p.1",)


def test_percent_and_bare_names_are_the_same_names():
  e = both_paths(module_with("a = f32[4] negate(%p)", "ROOT %b = f32[4] add(a, %a)")).entry
  assert e.root.operands == ("a", "a")


def test_attribute_continued_on_the_next_line():
  """A statement may go on after a line break, even with a leading comma
  (regression: the fast path took the first line and failed on the ',')."""
  text = module_with("ROOT r = f32[4] negate(p)", '  , metadata={op_name="x"}')
  assert both_paths(text).entry.root.metadata.op_name == "x"
  text = module_with("ROOT r = f32[4] negate(p)", "// comment", ', metadata={op_name="y"}')
  assert both_paths(text).entry.root.metadata.op_name == "y"
  text = module_with("ROOT r = f32[4] negate(p), sharding={devices=[2]0,1}")
  assert both_paths(text).entry.root.sharding == "{devices=[2]0,1}"


def test_parse_hlo_file_reads_bytes_as_written(tmp_path):
  path = tmp_path / "crlf.hlo"
  path.write_bytes(hlo_snippets.ALL["crlf"].encode())
  m = hlo_audit.parse_hlo_file(path)
  assert m == parse_hlo(hlo_snippets.CONTROL_FLOW)
  assert "\r\n" in m.text


def test_parse_hlo_rejects_non_text():
  with pytest.raises(TypeError):
    parse_hlo(b"HloModule m")  # type: ignore[arg-type]


# ------------------------------------------------------ malformed input ----

# Where XLA's parser reports the same line:column, the case says "(XLA)".
MALFORMED = [
    ("unknown opcode (XLA)", module_with("ROOT r = f32[4] frobnicate(p)"), 5, 19,
     "unknown opcode 'frobnicate'"),
    ("undefined operand (XLA)", module_with("ROOT r = f32[4] add(p, q)"), 5, 26,
     "operand q is not defined: no instruction of that name before this use"),
    ("name defined twice (XLA)", module_with("p = f32[4] negate(p)", "ROOT r = f32[4] negate(p)"),
     5, 3, "instruction p is defined twice in computation e"),
    ("attribute given twice (XLA)",
     module_with('ROOT r = f32[4] negate(p), metadata={op_name="a"}, metadata={op_name="b"}'),
     5, 54, "attribute metadata given twice"),
    ("missing computation (XLA)",
     module_with("z = f32[] constant(0)", "ROOT r = f32[] reduce(p, z), dimensions={0}, to_apply=nope"),
     6, 57, "computation nope does not exist"),
    ("unterminated computation (XLA)", module_with("ROOT r = f32[4] negate(p)")[:-2], 6, 1,
     "expected '}' to end computation e"),
    ("two ROOTs (XLA)", module_with("ROOT a = f32[4] negate(p)", "ROOT b = f32[4] negate(a)"),
     6, 3, "a computation can have only one ROOT"),
    ("arity (XLA)", module_with("ROOT r = f32[4] add(p)"), 5, 22,
     "add expects 2 operands, but has 1"),
    ("empty computation (XLA)", "HloModule m\n\nENTRY e {\n}\n", 4, 1,
     "expected an instruction: a computation cannot be empty"),
    ("two entries", "HloModule m\nENTRY a {\n  ROOT p = f32[] parameter(0)\n}\n"
     "ENTRY b {\n  ROOT p = f32[] parameter(0)\n}\n", 5, 7, "expected only one ENTRY computation"),
    ("bad signature shape (XLA)",
     "HloModule m\nENTRY e (p: g32[]) -> f32[] {\n  ROOT p = f32[] parameter(0)\n}\n",
     2, 13, "expected a shape, found identifier 'g32'"),
    ("bad constant literal (XLA)", module_with("ROOT c = f32[2] constant(}{1, 2})"), 5, 28,
     "expected ')', found '}'"),
    ("parameter number out of range (XLA)", module_with("ROOT q = f32[] parameter(99999999999999999999)"),
     5, 28, "integer out of range"),
    ("name glued to '=' (XLA)", module_with("ROOT r= f32[4] negate(p)"), 5, 8,
     "expected an instruction name, found attribute name 'r'"),
    ("'nan' as a name (XLA)", module_with("nan = f32[4] negate(p)", "ROOT r = f32[4] negate(nan)"),
     5, 3, "expected an instruction name, found decimal 'nan'"),
    ("non-ASCII digit (XLA)", module_with("ROOT q = f32[] parameter(\u00b2)"), 5, 28,
     "unexpected character '\u00b2'"),
    ("stray bracket in operands (XLA)", module_with("q = f32[4] negate(p)", "ROOT r = f32[4] add(%p,]%q)"),
     6, 26, "expected ')' to end the operands, found ']'"),
    ("NUL byte (XLA)", module_with("ROOT r = f32[4] negate(p)\0"), 5, 28, "NUL character in HLO text"),
    ("illegal name (XLA)", module_with("ROOT __r = f32[4] negate(p)"), 5, 8,
     "illegal instruction name '__r'; XLA would call it 'a_r'"),
    # A `%` name may be a keyword (`%true`), not an element type.
    ("element type as a name (XLA)", module_with("%s32 = f32[4] negate(p)",
                                                 "ROOT r = f32[4] negate(%s32)"),
     5, 3, "illegal instruction name 's32'; XLA would call it 's32_'"),
    ("layout rank", module_with("ROOT r = f32[4]{1,0} negate(p)"), 5, 18,
     "layout {1,0} has 2 dimensions, shape has 1"),
    ("parameter without shape", module_with("ROOT q = parameter(1)"), 5, 12,
     "cannot infer the shape of parameter: write it before the opcode"),
    ("'{' hidden by a comment (XLA)",
     "HloModule m\nENTRY e (p: f32[]) -> f32[] // {\n  ROOT p = f32[] parameter(0)\n}\n",
     3, 3, "expected '{' to start the computation body, found keyword 'ROOT'"),
    ("unterminated string (XLA)", module_with('ROOT r = f32[4] negate(p), metadata={op_name="abc}'),
     5, 48, "unterminated string"),
    ("empty text", "", 1, 1, "empty HLO text: expected 'HloModule', a computation or an instruction"),
    ("blank text", "  \n\n", 1, 1, "empty HLO text: expected 'HloModule', a computation or an instruction"),
    ("single instruction, then more", "ROOT r = f32[2] add(f32[2] x, f32[2] y) z", 1, 41,
     "expected end of input after a single instruction (is the 'HloModule' header missing?)"),
    ("duplicate computation", "HloModule m\nf {\n  ROOT a = f32[] parameter(0)\n}\n"
     "f {\n  ROOT a = f32[] parameter(0)\n}\n", 5, 1,
     "computation f is defined twice (first at line 2)"),
    ("control predecessor not defined", module_with("ROOT r = f32[4] negate(p), control-predecessors={q}"),
     5, 8, "control predecessor q is not defined before it is used"),
    # One of two undefined: named, not taken on the fast path with the other.
    ("one control predecessor of two not defined",
     module_with("ROOT r = f32[4] negate(p), control-predecessors={p, q}"),
     5, 8, "control predecessor q is not defined before it is used"),
    # A keyword names an instruction only after `%` (XLA: "expects name").
    ("keyword as a control predecessor (XLA)",
     module_with("%true = f32[4] negate(p)", "ROOT r = f32[4] negate(p), control-predecessors={p, true}"),
     6, 8, "expected an instruction name in control-predecessors"),
    # Regression: this error pointed into the attribute value (line 1).
    ("control predecessors without braces", module_with("ROOT r = f32[4] negate(p), control-predecessors=p"),
     5, 8, "expected '{' to start control-predecessors"),
    ("huge number in control predecessors",
     module_with("ROOT r = f32[4] negate(p), control-predecessors={99999999999999999999999q}"),
     5, 52, "integer out of range"),
]


@pytest.mark.parametrize("header", ["ENTRY e {", "ENTRY e (p: f32[4]) -> f32[4] {"])
def test_headers_in_xlas_forms_need_no_lexer(header, monkeypatch):
  # The fast path reads these lines whole, the last one of the text too:
  # the lexer (the slow path) reads the module's own header, nothing after.
  from hlo_audit._src.hlo import parser  # pylint: disable=import-outside-toplevel
  started = []
  lexer_at = parser._Parser.lexer_at
  monkeypatch.setattr(parser._Parser, "lexer_at",
                      lambda self, pos: started.append(pos) or lexer_at(self, pos))
  text = f"HloModule m\n\n{header}\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}}"
  assert _parse(text, None, fast=True).entry.root.name == "r"
  assert started and all(pos < text.index(header) for pos in started)


def test_a_renamed_module_keeps_every_control_predecessor():
  # XLA renames the entry's `a` (the called computation has one) to a.1:
  # operands and control predecessors follow, renamed or not.
  m = both_paths("""HloModule m

%f (a: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %n = f32[] negate(%a)
}

ENTRY %e (a: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] negate(%a), control-predecessors={%a}
  %c = f32[] call(%a), to_apply=%f
  ROOT %r = f32[] negate(%a), control-predecessors={%b}
}
""")
  got = {i.name: (i.operands, i.control_predecessors) for i in m.entry.instructions}
  assert got["b"] == (("a.1",), ("a.1",)) and got["r"] == (("a.1",), ("b",))


def test_a_keyword_is_a_name_after_percent():
  # XLA takes `%true` (it renames only element types and "__" names).
  m = both_paths(module_with("%true = f32[4] negate(p)", "ROOT r = f32[4] negate(%true)"))
  assert m.entry.root.operands == ("true",)


@pytest.mark.parametrize("text, line, column, message",
                         [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_input(text, line, column, message):
  """Exact line, column and message, the same from both paths."""
  for fast in (True, False):
    with pytest.raises(HloParseError) as e:
      _parse(text, None, fast)
    assert (e.value.line, e.value.column, e.value.message) == (line, column, message), fast
    assert e.value.line_text == text.split("\n")[line - 1]


def test_error_names_the_file(tmp_path):
  path = tmp_path / "bad.hlo"
  path.write_text(module_with("ROOT r = f32[4] frobnicate(p)"))
  with pytest.raises(HloParseError) as e:
    hlo_audit.parse_hlo_file(path)
  assert e.value.source == str(path)
  assert str(e.value).startswith(f"{path}:5:19: unknown opcode 'frobnicate'\n")


@pytest.mark.parametrize("line", [
    "ROOT r = f32[4] negate(p), backend_config=a?b",
    "ROOT r = f32[4] negate(p), backend_config=1.2.3",
    "ROOT r = f32[4] negate(p), backend_config=f32",
    "ROOT r = f32[4] negate(p), sharding={replicated // }",
    "ROOT r = f32[4] negate(p), index=99999999999999999999",
    "ROOT r = f32[4] negate(p), replica_groups=[2]<=[@]",
    "ROOT c = f32[2] constant(1.2.3)",
    "ROOT c = f32[2] constant({1, 2}})",
    "ROOT c = f32[] constant()",
])
def test_fast_path_takes_nothing_the_slow_path_rejects(line):
  """Regressions: the fast path's patterns once took values, literals and
  comments the lexer rejects; now both paths raise."""
  text = module_with(line)
  for fast in (True, False):
    with pytest.raises(HloParseError):
      _parse(text, None, fast)


def test_a_signature_shape_out_of_range_beside_a_known_one_is_an_error_at_its_column():
  # The fast header takes a signature whose shapes are all known or all
  # parse: one known shape (f32[4], the result's) does not vouch for the rest.
  text = ("HloModule m\n\n%c (a: f32[4], b: f32[99999999999999999999]) -> f32[4] {\n"
          "  ROOT a = f32[4] parameter(0)\n}\n\nENTRY e {\n  p = f32[4] parameter(0)\n"
          "  ROOT r = f32[4] call(p, p), to_apply=%c\n}\n")
  for fast in (True, False):
    with pytest.raises(HloParseError, match="^3:23: integer out of range"):
      _parse(text, None, fast)


def test_shapes_left_out_of_a_concatenate_and_a_transpose_are_inferred():
  # Hand-written HLO may omit what XLA can infer: the concatenated axis
  # (its `dimensions`) sums, a transpose permutes by its own.
  m = parse_hlo("HloModule m\n\nENTRY e {\n  a = f32[2,3] parameter(0)\n"
                "  b = f32[2,5] parameter(1)\n  c = concatenate(a, b), dimensions={1}\n"
                "  ROOT t = transpose(c), dimensions={1,0}\n}\n")
  c, t = m.entry.instruction("c"), m.entry.instruction("t")
  assert (c.shape.dims, t.shape.dims) == ((2, 8), (8, 2))


def test_a_reduce_without_its_shape_drops_the_reduced_dimensions():
  # XLA infers a reduce's result by removing its `dimensions` from the input
  # (its parser prints f32[3] and (f32[2,5], s32[2,5]) for this text); a
  # variadic reduce (argmax) gives a tuple, one array per input.
  m = both_paths(
      "HloModule m\n\nadd {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
      "  ROOT s = f32[] add(x, y)\n}\n\nargmax {\n  av = f32[] parameter(0)\n"
      "  ai = s32[] parameter(1)\n  bv = f32[] parameter(2)\n  bi = s32[] parameter(3)\n"
      "  gt = pred[] compare(av, bv), direction=GT\n  v = f32[] select(gt, av, bv)\n"
      "  i = s32[] select(gt, ai, bi)\n  ROOT t = (f32[], s32[]) tuple(v, i)\n}\n\n"
      "ENTRY e {\n  p = f32[2,3,5] parameter(0)\n  ids = s32[2,3,5] parameter(1)\n"
      "  z = f32[] constant(0)\n  zi = s32[] constant(0)\n"
      "  rows = reduce(p, z), dimensions={0,2}, to_apply=add\n"
      "  best = reduce(p, ids, z, zi), dimensions={1}, to_apply=argmax\n"
      "  ROOT out = tuple(rows, best)\n}\n")
  assert m.entry.instruction("rows").shape == parse_shape("f32[3]")
  assert m.entry.instruction("best").shape == parse_shape("(f32[2,5], s32[2,5])")
  assert m.entry.root.shape == parse_shape("(f32[3], (f32[2,5], s32[2,5]))")


def test_fast_path_operands_need_comma_space():
  """Regression: `%a,]%b` has the length of `%a, %b`."""
  with pytest.raises(HloParseError):
    parse_hlo(module_with("q = f32[4] negate(p)", "ROOT r = f32[4] add(%p,]%q)"))


def test_reserved_words_cannot_name_computations_by_reference():
  text = ("HloModule m\n%f32 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
          "  ROOT s = f32[] add(a, b)\n}\nENTRY e {\n  x = f32[2] parameter(0)\n"
          "  z = f32[] constant(0)\n  ROOT y = f32[] reduce(x, z), dimensions={0}, to_apply=f32\n}\n")
  for fast in (True, False):
    with pytest.raises(HloParseError) as e:
      _parse(text, None, fast)
    assert (e.value.line, e.value.column) == (10, 57)
  # With '%' it is a name; XLA then sanitizes the computation to `f32_`.
  m = both_paths(text.replace("to_apply=f32", "to_apply=%f32"))
  assert [c.name for c in m.computations] == ["f32_", "e"]
  assert m.entry.root.called_computations["to_apply"] == ("f32_",)


# ---------------------------------------------------------- deep nesting ----

DEEP = 100_000


@pytest.mark.parametrize("what, text", [
    ("parens in a shape", module_with("ROOT r = " + "(" * DEEP + "f32[]" + ")" * DEEP + " tuple()")),
    ("nested instructions", module_with("ROOT r = f32[4] " + "negate(" * DEEP + "p" + ")" * DEEP)),
    ("braces in an attribute", module_with("ROOT r = f32[4] negate(p), sharding=" + "{" * DEEP + "}" * DEEP)),
    ("brackets in an attribute", module_with("ROOT r = f32[4] negate(p), foo=" + "[" * DEEP + "]" * DEEP)),
    ("parens in a literal", module_with("ROOT c = f32[] constant(" + "(" * DEEP + ")" * DEEP + ")")),
    ("braces in a literal", module_with("ROOT c = f32[] constant(" + "{" * DEEP + "}" * DEEP + ")")),
    ("unclosed parens", "(" * DEEP),
    ("unclosed braces", "HloModule m\nENTRY e {\n" + "{" * DEEP),
    ("inline computations", "HloModule m\nENTRY e {\n  ROOT r = f32[] call(), to_apply="
     + "{\n ROOT r = f32[] call(), to_apply=" * 5000 + "{\n ROOT x = f32[] constant(0)\n}" + "\n}" * 5001),
    ("tuple shape in signature", "HloModule m\nENTRY e (p: " + "(" * DEEP + "f32[]" + ")" * DEEP
     + ") -> f32[] {\n  ROOT r = f32[] constant(0)\n}\n"),
])
def test_deep_nesting_raises_parse_error(what, text):
  """Hostile nesting raises HloParseError (never RecursionError), from both
  paths."""
  for fast in (True, False):
    with pytest.raises(HloParseError) as e:
      _parse(text, None, fast)
    assert e.value.line >= 1 and e.value.column >= 1


def test_deeply_nested_shape_reports_the_limit():
  """parse_shape stops at grammar.MAX_DEPTH: the error points at the first
  '(' past it."""
  text = "(" * DEEP + "f32[]" + ")" * DEEP
  with pytest.raises(HloParseError) as e:
    parse_shape(text)
  assert (e.value.line, e.value.column) == (1, grammar.MAX_DEPTH + 2)
  assert "nested too deeply" in e.value.message


def test_nesting_within_the_limit_parses():
  depth = grammar.MAX_DEPTH - 1
  s = parse_shape("(" * depth + "f32[2]" + ")" * depth)
  for _ in range(depth):
    (s,) = s.tuple_shapes
  assert s == parse_shape("f32[2]")


# ------------------------------------------- tuple elements in XLA dumps ----


def test_tuple_element_operands_become_get_tuple_elements():
  # XLA:GPU's dumps leave get-tuple-elements out and write `%t#i`; the parser
  # makes them as XLA's does (checked against XLA in test_snippets_match_xla
  # where the installed jaxlib reads them): right before the first reader,
  # once per path, named after the tuple and made unique.
  m = both_paths(hlo_snippets.TUPLE_ELEMENTS)
  entry = m.entry
  assert [i.name for i in entry.instructions] == [
      "x", "y", "f", "t", "f_1", "t_1", "t_0", "a", "t_1.1", "t_1_1", "b", "c"]
  gte = {i.name: i for i in entry.instructions if i.opcode == "get-tuple-element"}
  assert {n: (i.operands, i.tuple_index, i.shape.dtype_str) for n, i in gte.items()} == {
      "f_1": (("f",), 1, "f32[4]"), "t_0": (("t",), 0, "f32[4]"),
      "t_1.1": (("t",), 1, "(f32[4], f32[4])"), "t_1_1": (("t_1.1",), 1, "f32[4]")}
  assert entry.instruction("c").operands == ("b", "t_0")


@pytest.mark.parametrize("operand, message", [
    ("%t#2", "t has no tuple element 2"),
    ("%x#0", "x has no tuple element 0"),
    ("%t#", "expected a tuple index after '#'"),
    ("%nope#0", "operand nope is not defined"),
])
def test_bad_tuple_element_operands(operand, message):
  text = ("HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n"
          "  t = (f32[4], f32[4]) tuple(x, x)\n"
          f"  ROOT r = f32[4] negate({operand})\n}}\n")
  with pytest.raises(HloParseError, match=message):
    parse_hlo(text)


def test_no_shape_is_inferred_from_an_operand_of_unknown_shape():
  from hlo_audit._src.hlo import shape_inference  # pylint: disable=import-outside-toplevel
  f32 = parse_shape("f32[4]")
  none = lambda name: None  # noqa: E731 - no computation roots here
  assert shape_inference.infer("tuple", [f32, f32], {}, none) is not None
  for opcode in ("tuple", "add", "select"):
    assert shape_inference.infer(opcode, [f32, None, f32][:3 if opcode == "select" else 2],
                                 {}, none) is None, opcode

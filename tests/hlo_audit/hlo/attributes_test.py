"""Attribute decoders: raw attribute text in, typed IR values out, and
errors that point into the module text."""

from __future__ import annotations

import hlo_snippets
import pytest

from hlo_audit import HloParseError, parse_hlo, parse_shape
from hlo_audit._src.hlo import attributes
from hlo_audit._src.hlo.ir import (ConvDimensionNumbers, Metadata, OutputOperandAlias,
                                   PaddingDim, SliceDim, WindowDim)


def module_with(line: str) -> str:
  """A module whose entry has `p` (f32[4]) and then `line` as its root."""
  return f"HloModule m\nENTRY e {{\n  p = f32[4] parameter(0)\n  {line}\n}}\n"


# ---------------------------------------------------------------- decoders --


def test_split_attributes():
  out = attributes.split_attributes(
      ', kind=kLoop, calls=%f, metadata={op_name="a, b=c"}, backend_config={"x": {"y": 1}}')
  assert dict(out) == {"kind": "kLoop", "calls": "%f", "metadata": '{op_name="a, b=c"}',
                       "backend_config": '{"x": {"y": 1}}'}


def test_split_attributes_rejects_repeats():
  with pytest.raises(HloParseError, match="attribute kind given twice"):
    attributes.split_attributes(", kind=kLoop, kind=kInput")


def test_metadata():
  md = attributes.metadata(
      '{op_type="dot" op_name="jit(f)/dot_general" source_file="/a/b.py" '
      'source_line=12 source_end_line=13 source_column=4 source_end_column=30 '
      'stack_frame_id=7 deduplicated_name="fusion.1" scheduling_name="s" '
      'profile_type={1,2}}')
  assert md == Metadata(op_type="dot", op_name="jit(f)/dot_general",
                        source_file="/a/b.py", source_line=12, source_end_line=13,
                        source_column=4, source_end_column=30, stack_frame_id=7,
                        deduplicated_name="fusion.1", scheduling_name="s",
                        profile_type=(1, 2))


@pytest.mark.parametrize("raw, common", [
    ('{op_name="jit(f)/mul" stack_frame_id=12}', True),   # JAX's dumps, nearly all
    ('{op_name="jit(f)/mul"}', True),
    ('{op_name="" stack_frame_id=0012}', True),
    ('{op_name="a\\"b" stack_frame_id=1}', False),   # an escape: the full decode
    ('{stack_frame_id=3 op_name="late"}', False),
    ('{op_name="x" stack_frame_id=3 source_line=2}', False),
    ('{op_name="x"  stack_frame_id=3}', False),
    ('{op_name="x" stack_frame_id=-3}', False),
])
def test_metadata_common_form_agrees_with_the_lexer(raw, common):
  """The one-match read of the common form says what the lexer's path says."""
  assert (attributes._MD_COMMON.fullmatch(raw) is not None) is common
  assert attributes.metadata(raw) == attributes._metadata_slow(raw, None)


def test_metadata_keeps_unknown_fields_raw():
  md = attributes.metadata('{op_name="x" preserve_layout=true future_field={1, 2}}')
  assert md.op_name == "x"
  assert dict(md.extra) == {"preserve_layout": "true", "future_field": "{1, 2}"}


def test_metadata_unescapes_strings():
  md = attributes.metadata(r'{op_name="a\"b\\c" source_file="x\ty"}')
  assert md.op_name == 'a"b\\c'
  assert md.source_file == "x\ty"


def test_window():
  w = attributes.window("{size=3x2 stride=2x1 pad=1_1x0_2 lhs_dilate=1x2 rhs_dilate=3x1 rhs_reversal=1x0}")
  assert w == (WindowDim(size=3, stride=2, padding_low=1, padding_high=1,
                         base_dilation=1, window_dilation=3, window_reversal=True),
               WindowDim(size=2, stride=1, padding_low=0, padding_high=2,
                         base_dilation=2, window_dilation=1, window_reversal=False))


def test_window_defaults():
  assert attributes.window("{size=4}") == (WindowDim(size=4),)
  assert attributes.window("{}") == ()


def test_slices():
  assert attributes.slice_ranges("{[0:2], [1:9:2]}") == (SliceDim(0, 2, 1), SliceDim(1, 9, 2))


def test_padding_config():
  assert attributes.padding_config("0_0x1_2_3x-1_0") == (
      PaddingDim(0, 0, 0), PaddingDim(1, 2, 3), PaddingDim(-1, 0, 0))


def test_dim_labels():
  d = attributes.dim_labels("b01f_01io->b01f")
  assert d == ConvDimensionNumbers(
      labels="b01f_01io->b01f", input_batch=0, input_feature=3, input_spatial=(1, 2),
      kernel_input_feature=2, kernel_output_feature=3, kernel_spatial=(0, 1),
      output_batch=0, output_feature=3, output_spatial=(1, 2))
  # Spatial dimensions are listed by their number, wherever they sit.
  d = attributes.dim_labels("f10b_o10i->10fb")
  assert (d.input_batch, d.input_feature, d.input_spatial) == (3, 0, (2, 1))
  assert (d.kernel_input_feature, d.kernel_output_feature, d.kernel_spatial) == (3, 0, (2, 1))
  assert (d.output_batch, d.output_feature, d.output_spatial) == (3, 2, (1, 0))


def test_string_map_with_mlir_text():
  """Frontend attributes: quoted strings, and raw MLIR text in braces."""
  fa = attributes.string_map(
      '{_xla_stream="1", xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}, k="a\\"b"}')
  assert dict(fa) == {"_xla_stream": "1",
                      "xla.sdy.meshes": '{mesh = #sdy.mesh<["x"=2, "y"=4]>}',
                      "k": 'a"b'}


def test_output_operand_aliasing():
  assert attributes.output_operand_aliasing("{{0}: (1, {}), {1, 2}: (0, {3})}") == (
      OutputOperandAlias((0,), 1, ()), OutputOperandAlias((1, 2), 0, (3,)))
  assert attributes.output_operand_aliasing("{}") == ()


def test_bool_list_and_single_bool():
  assert attributes.bool_list("{true,false, true}") == (True, False, True)
  assert attributes.bool_list("false") == (False,)


def test_computation_list():
  assert attributes.computation_list("%a") == ("a",)
  assert attributes.computation_list("{%a, b}") == ("a", "b")
  assert attributes.computation_list("{}") == ()


@pytest.mark.parametrize("raw", ["%fused_computation.12", "%a-b_c.3", "%_x", "%a b",
                                 "%a,", "%1a", "%", "%a%b", "%a\n"])
def test_one_computation_read_without_the_lexer_agrees_with_it(raw):
  """`%name` alone skips the lexer: the same name, or the same error."""
  def through_lexer():
    # The fast form never matches a leading '{': the lexer's path alone.
    try:
      return attributes.computation_list("{" + raw + "}")
    except HloParseError:
      return "error"
  try:
    fast = attributes.computation_list(raw)
  except HloParseError:
    fast = "error"
  assert fast == through_lexer()


def test_program_shape():
  ps = attributes.program_shape("{(f32[2]{0}, (s32[], pred[]))->bf16[3]{0}}")
  assert ps.parameters == (parse_shape("f32[2]{0}"), parse_shape("(s32[], pred[])"))
  assert ps.result == parse_shape("bf16[3]{0}")


@pytest.mark.parametrize("decoder, raw", [
    (attributes.metadata, "{op_name=5}"),
    (attributes.window, "{size=3 bogus=1}"),
    (attributes.window, "{size=3 size=3}"),
    (attributes.slice_ranges, "{[0:1:2:3]}"),
    (attributes.padding_config, "1x2"),
    (attributes.dim_labels, "b01_01io->b01f"),
    (attributes.string, "unquoted"),
    (attributes.int_list, "{1, x}"),
    (attributes.integer, "1 2"),
    (attributes.module_aliasing, "{ {0}: (0, {}, maybe) }"),
    (attributes.program_shape, "{(f32[])}"),
])
def test_malformed_values(decoder, raw):
  with pytest.raises(HloParseError):
    decoder(raw)


# ------------------------------------------------ typed views of a module --


def test_typed_views_of_windows_snippet():
  e = parse_hlo(hlo_snippets.WINDOWS).entry
  conv = e.instruction("conv")
  assert conv.window == (WindowDim(size=3, stride=2, padding_low=1, padding_high=1),) * 2
  assert conv.convolution_dimension_numbers.labels == "b01f_01io->b01f"
  assert e.instruction("padded").padding == (
      PaddingDim(0, 0, 0), PaddingDim(1, 1, 0), PaddingDim(0, 3, 1), PaddingDim(0, 0, 0))
  assert e.instruction("sl").slices == (
      SliceDim(0, 1), SliceDim(1, 7, 2), SliceDim(0, 12, 2), SliceDim(0, 8))
  dnums = e.instruction("dot").dot_dimension_numbers
  assert (dnums.lhs_contracting, dnums.rhs_contracting) == ((1,), (0,))
  assert (dnums.lhs_batch, dnums.rhs_batch) == ((), ())
  assert e.instruction("tr").dimensions == (1, 0)
  assert e.instruction("x").window is None and e.instruction("x").dimensions is None


def test_typed_views_of_attributes_snippet():
  e = parse_hlo(hlo_snippets.ATTRIBUTES).entry
  cc = e.instruction("cc")
  assert cc.custom_call_target == "Sharding"
  assert cc.sharding == "{devices=[2,1]<=[2]}"
  assert cc.custom_call_schedule == "SCHEDULE_LATEST"
  assert cc.output_to_operand_aliasing == (OutputOperandAlias((), 0, ()),)
  assert dict(cc.frontend_attributes) == {
      "_xla_compute_type": "host", "xla.sdy.meshes": '{mesh = #sdy.mesh<["x"=2]>}'}
  assert e.instruction("p0").parameter_replication == (True,)
  assert e.instruction("p1").parameter_replication == (False, True)
  assert e.instruction("g").tuple_index == 1
  assert e.instruction("g").parameter_replication is None


def test_backend_config_raw_and_json():
  """backend_config stays raw text; JSON is decoded only on request."""
  e = parse_hlo(hlo_snippets.ATTRIBUTES).entry
  cc = e.instruction("cc")
  assert cc.backend_config == '{"k": [1, 2], "nested": {"a": "b"}}'
  assert cc.backend_config_json() == {"k": [1, 2], "nested": {"a": "b"}}
  assert e.instruction("g").backend_config is None
  assert e.instruction("g").backend_config_json() is None
  ars = parse_hlo(hlo_snippets.SCHEDULED_ASYNC).entry.instruction("ars")
  assert ars.backend_config_json() == {"operation_queue_id": "0",
                                       "wait_on_operation_queues": []}


def test_string_backend_config():
  e = parse_hlo(module_with(
      r'ROOT c = f32[4] custom-call(p), custom_call_target="t", backend_config="opaque \"bytes\""')).entry
  assert e.root.backend_config == 'opaque "bytes"'
  assert e.root.backend_config_json() is None  # not a JSON dict


def test_string_backend_config_holding_json():
  e = parse_hlo(module_with(
      r'ROOT c = f32[4] custom-call(p), custom_call_target="t", backend_config="{\"a\": 1}"')).entry
  assert e.root.backend_config == '{"a": 1}'
  assert e.root.backend_config_json() == {"a": 1}


def test_backend_config_that_is_not_json():
  """XLA keeps any braced text; we hand it back raw and decode nothing."""
  e = parse_hlo(module_with(
      "ROOT c = f32[4] custom-call(p), custom_call_target=\"t\", backend_config={not: json}")).entry
  assert e.root.backend_config == "{not: json}"
  assert e.root.backend_config_json() is None
  e.root.decode_all()


# ----------------------------------------------- decode errors, positioned --


@pytest.mark.parametrize("line, offending, message", [
    ('ROOT r = f32[4] negate(p), metadata={op_name=5}', "5",
     "expected a string for op_name, found integer '5'"),
    ('ROOT r = f32[4] negate(p), metadata={op_name="a" op_name="b"}', 'op_name="b"',
     "metadata field 'op_name' given twice"),
    ('ROOT r = f32[4] negate(p), metadata={op_name="a" source_line=x}', "x",
     "expected integer for source_line, found identifier 'x'"),
    ('ROOT r = f32[4] negate(p), metadata={op_name="a" source_line="3"}', '"3"',
     "expected integer for source_line, found string '3'"),
    ("ROOT r = f32[2] slice(p), slice={[0:2:1:1]}", "]",
     "expected start:limit or start:limit:stride"),
    ("ROOT r = f32[4,2] broadcast(p), dimensions={0,x}", "x",
     "expected integer, found identifier 'x'"),
    ('ROOT r = f32[4] negate(p), frontend_attributes={a="x" b}', "b",
     "expected '}' to end attributes, found identifier 'b'"),
    ("ROOT r = f32[4] custom-call(p), custom_call_target=foo", "foo",
     "expected a string, found identifier 'foo'"),
    ('ROOT r = f32[4] custom-call(p), custom_call_target="x", output_to_operand_aliasing={{}: (0)}',
     ")", "expected ',' after the operand number, found ')'"),
    ("ROOT r = f32[4] negate(p), channel_id=x", "x", "expected integer, found identifier 'x'"),
])
def test_decode_errors_point_into_the_module(line, offending, message):
  """Attributes decode lazily; their errors carry the module's line (4) and
  the column of the offending text (its last occurrence on the line)."""
  m = parse_hlo(module_with(line))
  with pytest.raises(HloParseError) as e:
    m.decode_all()
  line_text = "  " + line
  column = line_text.rindex(offending) + 1
  assert (e.value.line, e.value.column, e.value.message) == (4, column, message)
  assert e.value.line_text == line_text


def test_header_decode_errors_point_into_the_header():
  m = parse_hlo("HloModule m, entry_computation_layout={(f32[])->g32[]}\n"
                "ENTRY e {\n  ROOT a = f32[] parameter(0)\n}\n")
  with pytest.raises(HloParseError) as e:
    m.entry_computation_layout  # noqa: B018
  assert (e.value.line, e.value.column) == (1, 49)
  m = parse_hlo("HloModule m, input_output_alias={ {0}: (0, {}, maybe) }\n"
                "ENTRY e {\n  ROOT a = f32[] parameter(0)\n}\n")
  with pytest.raises(HloParseError) as e:
    m.decode_all()
  assert (e.value.line, e.value.column, e.value.message) == (
      1, 48, "expected may-alias or must-alias")


def test_deeply_nested_backend_config_json_is_not_decoded():
  """json.loads recurses on nested arrays; the decoder must not let that
  RecursionError out (regression: it did)."""
  deep = "[" * 100_000 + "]" * 100_000
  m = parse_hlo(module_with(
      f'ROOT r = f32[4] custom-call(p), custom_call_target="t", backend_config={{"a": {deep}}}'))
  m.decode_all()
  assert m.entry.root.backend_config_json() is None


def test_decode_all_on_every_snippet():
  for text in hlo_snippets.ALL.values():
    parse_hlo(text).decode_all()


@pytest.mark.parametrize("line, offending, message", [
    # Regressions: these errors were located in the value's own text (line 1).
    ("ROOT r = f32[4] negate(p), channel_id= /*c*/ x", "x", "expected integer, found identifier 'x'"),
    ("ROOT r = f32[4] negate(p), metadata={profile_type={x}}", "x",
     "expected integer, found identifier 'x'"),
    ("ROOT r = f32[4] negate(p), metadata={source_line=99999999999999999999}", "9",
     "integer out of range"),
])
def test_more_decode_errors_point_into_the_module(line, offending, message):
  m = parse_hlo(module_with(line))
  with pytest.raises(HloParseError) as e:
    m.decode_all()
  line_text = "  " + line
  column = line_text.index(offending) + 1
  assert (e.value.line, e.value.column, e.value.message) == (4, column, message)


def test_value_on_the_next_line_is_located():
  m = parse_hlo(module_with("ROOT r = f32[4] broadcast(p), dimensions=\n    {0,x}"))
  with pytest.raises(HloParseError) as e:
    m.decode_all()
  assert (e.value.line, e.value.column, e.value.line_text) == (5, 8, "    {0,x}")


def test_header_value_after_a_space_is_located():
  m = parse_hlo("HloModule m, entry_computation_layout= {(f32[])->g32[]}\n"
                "ENTRY e {\n  ROOT a = f32[] parameter(0)\n}\n")
  with pytest.raises(HloParseError) as e:
    m.entry_computation_layout  # noqa: B018
  assert (e.value.line, e.value.column) == (1, 50)


def test_execution_thread_error_is_located():
  text = "HloModule m\nENTRY e {\n  ROOT a = f32[] parameter(0)\n}, execution_thread=nan\n"
  with pytest.raises(HloParseError) as e:
    parse_hlo(text)
  assert (e.value.line, e.value.column, e.value.message) == (4, 21, "expected a string, found decimal 'nan'")


@pytest.mark.parametrize("raw", [
    '{op_name="a" source_line=12}', '{op_name="a", source_line=12}', "{}", "{ }",
    '{op_name="a\\"b"}', '{x=1 y={1} z=true}', '{,op_name="a"}', '{op_name="a,"}',
    "{profile_type={1,2}}",
    # Each of these the lexer rejects; the fast path once took them.
    '{op_name="a" ,}', "{,}", "{source_line=\u0661\u0662}", "{source_line=99999999999999999999}",
    "{profile_type={x}}", '{op_name="a"\u00a0op_type="b"}',
    '{op_name="a" op_name="b"}', "{op_name=5}", '{op_name="a"', 'op_name="a"}',
])
def test_metadata_fast_path_agrees_with_the_lexer(raw):
  """`metadata` reads common text with a regex and hands anything else to
  the lexer-based decoder; both give the same result or both raise."""
  def run(decode):
    try:
      return decode(raw, None)
    except HloParseError as e:
      return ("error", e.message)
  assert run(attributes.metadata) == run(attributes._metadata_slow)


_WINDOWS = ["{size=32 stride=32}", "{size=32x32 stride=32x32}", "{size=3x3 pad=1_1x1_1}",
            "{size=12x32 stride=12x32 pad=0_0x8_8}", "{size=2 stride=2 pad=0_1 lhs_dilate=2}",
            "{size=3 rhs_dilate=2}", "{size=1x2x3 stride=1 pad=0_0}", "{size=03}",
            "{size=3 pad=-1_0}", "{size=3 pad=1}", "{stride=2 size=3}", "{size=3 size=3}",
            "{size=3 rhs_reversal=1}", "{size=3x}", "{size=3  stride=2}", "{}"]


def _fixture_windows() -> list[str]:
  import gzip
  import pathlib
  import re
  here = pathlib.Path(__file__).resolve().parents[1] / "real_models"
  found = set()
  for path in sorted(here.glob("*/*.hlo.gz")):
    found |= set(re.findall(r"window=(\{[^}\n]*\})", gzip.decompress(path.read_bytes()).decode()))
  return sorted(found)


@pytest.mark.parametrize("raw", _WINDOWS + _fixture_windows())
def test_a_plain_window_read_without_the_lexer_agrees_with_it(raw):
  """`window` reads XLA's common form at once: the same dims, or the same
  error, as the lexer's reading (the committed compiles' windows included)."""
  def read(fn):
    try:
      return fn(raw)
    except HloParseError as e:
      return f"error: {e.message}"
  assert read(attributes.window) == read(
      lambda r: attributes._window_dims(attributes._window_fields(r)))

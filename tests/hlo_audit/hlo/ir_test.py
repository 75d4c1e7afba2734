"""The typed, immutable IR: shapes and byte sizes, layouts, modules,
computations, instructions, metadata and stack frames.

Expected values are worked out by hand from the HLO text in each test.
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib

import hlo_snippets
import pytest

import hlo_audit
from hlo_audit import HloParseError, parse_hlo, parse_shape
from hlo_audit._src.hlo.ir import COMBINE_DIMENSION, UNBOUNDED, Layout, Shape, Tile

# ---------------------------------------------------------------- shapes ----


@pytest.mark.parametrize("text, byte_size", [
    ("f32[128,512]{1,0}", 128 * 512 * 4),
    ("f32[128,512]", 262144),
    ("bf16[8,128]{1,0}", 8 * 128 * 2),
    ("f64[3]", 24),
    ("c64[3]", 24),
    ("c128[2]", 32),
    ("s64[2,2]", 32),
    ("u16[7]", 14),
    ("pred[5]", 5),  # one byte per pred
    ("s8[]", 1),  # scalar
    ("f32[0,4]", 0),  # no elements
    ("s4[64]", 64),  # sub-byte, unpacked: one element per byte
    ("s4[64]{0:E(4)}", 32),  # packed by E(4)
    ("u4[3]", 3),
    ("u4[3]{0:E(4)}", 2),  # 12 bits round up to 2 bytes
    ("s2[8]{0:E(2)}", 2),
    ("u1[9]{0:E(1)}", 2),
    ("f4e2m1fn[7]{0:E(4)}", 4),
    ("f4e2m1fn[7]", 7),
    ("f8e4m3fn[10]", 10),
    ("f8e5m2[2,3]", 6),
    ("f8e8m0fnu[4]", 4),
    ("f8e4m3b11fnuz[4]", 4),
    ("token[]", 0),
    ("(f32[2], /*index=1*/s32[], (pred[3], token[]))", 8 + 4 + 3 + 0),
    ("()", 0),
    ("f32[<=4,3]", 48),  # bounded dynamic dims count at their bound
])
def test_byte_size(text, byte_size):
  """byte_size: elements times storage width; E(n) packs sub-byte types;
  tuples sum their elements; tokens take nothing."""
  assert parse_shape(text).byte_size == byte_size


def test_byte_size_with_unbounded_dimension_is_zero():
  """An unbounded dimension (`?`) has no size, so neither has the shape."""
  s = parse_shape("f32[<=4,?]")
  assert s.dims == (4, UNBOUNDED)
  assert s.dynamic_dims == (True, True)
  assert s.is_dynamic
  assert s.num_elements == 0
  assert s.byte_size == 0


def test_dynamic_dims_only_mark_dynamic_dimensions():
  s = parse_shape("s32[2,<=8,3]")
  assert s.dims == (2, 8, 3)
  assert s.dynamic_dims == (False, True, False)
  assert str(s) == "s32[2,<=8,3]"
  static = parse_shape("s32[2,8,3]")
  assert static.dynamic_dims == () and not static.is_dynamic


@pytest.mark.parametrize("text, physical", [
    # bf16[5,100] in T(8,128) tiles: 8 x 128 elements of 2 bytes.
    ("bf16[5,100]{1,0:T(8,128)}", 8 * 128 * 2),
    # Layout {0,1}: dimension 0 is minor, so the physical shape is [100,5]
    # and pads to [104,128].
    ("f32[5,100]{0,1:T(8,128)}", 104 * 128 * 4),
    ("f32[3]{0:T(256)}", 256 * 4),
    ("f32[8,128]{1,0:T(8,128)}", 8 * 128 * 4),  # already aligned
    ("f32[5,100]{1,0}", 5 * 100 * 4),  # untiled
])
def test_physical_byte_size_pads_to_the_first_tile(text, physical):
  assert parse_shape(text).physical_byte_size == physical


def test_tpu_layout_fields():
  """`{1,0:T(8,128)(2,1)S(1)}`: minor-to-major, two tiles, memory space 1."""
  s = parse_shape("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}")
  assert s.element_type == "bf16"
  assert s.dims == (8, 128)
  assert s.layout.minor_to_major == (1, 0)
  assert s.layout.tiles == (Tile((8, 128)), Tile((2, 1)))
  assert s.layout.memory_space == 1
  assert s.layout.element_size_bits == 0
  assert s.byte_size == 2048
  assert str(s) == "bf16[8,128]{1,0:T(8,128)(2,1)S(1)}"


@pytest.mark.parametrize("text", [
    # Every field XLA prints, in its order.
    "f32[8,128]{1,0:D(D,C)T(8,128)L(2)#(u32)*(u64)E(32)S(1)SC(0:4)P(f32[16,128]{1,0})M(8)}",
    "s4[256]{0:T(512)(128)(2,1)E(4)}",
    "f32[8,128]{1,0:#(u16)*(u32)}",
    "f32[8]{0:M(16)}",
    "f32[8,4]{0,1:L(4)}",
    "f32[8,4]{0,1}",
])
def test_a_layout_prints_as_xla_wrote_it(text):
  assert str(parse_shape(text)) == text


def test_split_configs_and_a_physical_shape_are_their_own_fields():
  s = parse_shape("f32[1024,8]{1,0:T(8,128)SC(0:512,256)(1:)}")
  assert s.layout.split_configs == ((0, (512, 256)), (1, ()))
  assert s.layout.physical_shape is None
  assert str(s) == "f32[1024,8]{1,0:T(8,128)SC(0:512,256)(1:)}"
  p = parse_shape("f32[1024,8]{1,0:T(8,128)P(f32[2048,8]{1,0})}")
  assert p.layout.split_configs == ()
  assert (p.layout.physical_shape.dims, p.layout.physical_shape.element_type) == ((2048, 8), "f32")


def test_layout_with_every_common_field():
  s = parse_shape("s4[2,256]{1,0:T(2,128)(4,1)L(4)E(4)S(2)M(16)}")
  lay = s.layout
  assert lay.tiles == (Tile((2, 128)), Tile((4, 1)))
  assert lay.tail_padding_alignment == 4
  assert lay.element_size_bits == 4
  assert lay.memory_space == 2
  assert lay.dynamic_metadata_prefix_bytes == 16
  assert s.byte_size == 256  # 512 four-bit elements


def test_combined_tile_dimension():
  """`*` in a tile combines a dimension with the next."""
  s = parse_shape("f32[4,8]{1,0:T(*,128)}")
  assert s.layout.tiles == (Tile((COMBINE_DIMENSION, 128)),)
  assert str(s.layout) == "{1,0:T(*,128)}"


def test_sparse_layout():
  s = parse_shape("f32[4,4]{1,0:D(D,C)#(u16)*(u32)}")
  assert s.layout.dim_level_types == ("D", "C")
  assert s.layout.index_type == "u16"
  assert s.layout.pointer_type == "u32"


def test_memory_space_and_element_size_default_to_zero():
  lay = parse_shape("f32[2]{0}").layout
  assert (lay.memory_space, lay.element_size_bits, lay.tiles) == (0, 0, ())
  assert parse_shape("f32[2]").layout is None


def test_tuple_shapes_nest_and_drop_index_comments():
  s = parse_shape("(f32[2]{0}, s32[], /*index=2*/(bf16[3], pred[]), /*index=3*/token[])")
  assert s.is_tuple and not s.is_array
  assert len(s.tuple_shapes) == 4
  assert s.tuple_shapes[2] == Shape("tuple", tuple_shapes=(Shape("bf16", (3,)), Shape("pred")))
  assert s.subshape((2, 0)) == Shape("bf16", (3,))
  assert [i for i, _ in s.leaves()] == [(0,), (1,), (2, 0), (2, 1), (3,)]
  assert str(s) == "(f32[2]{0}, s32[], (bf16[3], pred[]), token[])"
  with pytest.raises(IndexError):
    s.subshape((5,))


def test_buffer_shape():
  s = parse_shape("b(f32[4]{0})")
  assert s.is_buffer
  assert s.dims == (4,)
  assert s.byte_size == 16


@pytest.mark.parametrize("type_name", [
    "pred", "s1", "s2", "s4", "s8", "s16", "s32", "s64", "u1", "u2", "u4", "u8",
    "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "c64", "c128", "f4e2m1fn",
    "f8e3m4", "f8e4m3", "f8e4m3fn", "f8e4m3b11fnuz", "f8e4m3fnuz", "f8e5m2",
    "f8e5m2fnuz", "f8e8m0fnu"])
def test_every_element_type_parses(type_name):
  """Every type XLA prints, the fp8 and sub-byte ones included."""
  s = parse_shape(f"{type_name}[2]")
  assert s.element_type == type_name
  assert s.rank == 1


def test_scalar_and_token_shapes():
  assert parse_shape("f32[]").rank == 0
  assert parse_shape("f32[]").num_elements == 1
  t = parse_shape("token[]")
  assert t.element_type == "token" and not t.is_array


@pytest.mark.parametrize("text, line, column", [
    ("f32[2,3]{0}", 1, 9),  # layout rank differs from shape rank
    ("f32[2", 1, 6),  # end of input where ']' belongs
    ("g32[2]", 1, 1),  # not an element type
    ("f32[-1]", 1, 5),  # negative size
    ("(f32[2], s32[]", 1, 15),  # unclosed tuple
    ("f32[2]{0:T(8,128}", 1, 17),  # unclosed tile
    ("f32[2] extra", 1, 8),  # trailing text
])
def test_malformed_shapes(text, line, column):
  with pytest.raises(HloParseError) as e:
    parse_shape(text)
  assert (e.value.line, e.value.column) == (line, column), e.value


def test_shape_is_frozen():
  s = parse_shape("f32[2]")
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.dims = (3,)  # type: ignore[misc]


def test_shapes_compare_by_value():
  assert parse_shape("f32[2,3]{1,0}") == Shape("f32", (2, 3), layout=Layout((1, 0)))
  assert parse_shape("f32[2,3]{1,0}") != parse_shape("f32[2,3]{0,1}")
  assert parse_shape("f32[2,3]") != parse_shape("f32[2,3]{1,0}")
  assert hash(parse_shape("f32[2]{0}")) == hash(parse_shape("f32[2]{0}"))


def test_dtype_str_leaves_out_layouts():
  assert parse_shape("f32[128,512]{0,1:T(8,128)}").dtype_str == "f32[128,512]"
  assert parse_shape("(f32[2]{0}, s8[])").dtype_str == "(f32[2], s8[])"


# ---------------------------------------------------------------- module ----


def test_module_header_attributes():
  m = parse_hlo(hlo_snippets.SCHEDULED_ASYNC)
  assert m.name == "jit_step"
  assert m.is_scheduled
  assert m.attributes["num_partitions"] == "2"
  assert m.entry_name == "main" and m.entry.is_entry
  layout = m.entry_computation_layout
  assert layout.parameters == (parse_shape("f32[8]{0}"),) * 2
  assert layout.result == parse_shape("(f32[8]{0}, f32[8]{0}, f32[8]{0}, "
                                      "f32[8]{0}, f32[8]{0}, f32[8]{0})")
  assert not parse_hlo(hlo_snippets.NESTED).is_scheduled


def test_module_without_entry_layout_or_aliases():
  m = parse_hlo(hlo_snippets.NESTED)
  assert m.entry_computation_layout is None
  assert m.input_output_alias == ()
  assert m.stack_frame_index is None


def test_input_output_alias():
  m = parse_hlo(hlo_snippets.ATTRIBUTES)
  a, b = m.input_output_alias
  assert (a.output_index, a.parameter, a.parameter_index, a.must_alias) == ((0,), 0, (), False)
  assert (b.output_index, b.parameter, b.parameter_index, b.must_alias) == ((1,), 1, (1,), True)


def test_computations_in_text_order_with_roots():
  m = parse_hlo(hlo_snippets.CONTROL_FLOW)
  assert [c.name for c in m.computations] == [
      "cond", "body", "branch0", "branch1", "fused", "main"]
  body = m.computation("body")
  # XLA's module-wide uniquifier renames the second `i`.
  assert [i.name for i in body.instructions] == ["bp", "i.1", "one", "next", "v", "out"]
  assert body.root.name == "out" and body.is_root("out")
  assert body.instruction("i.1").tuple_index == 0
  assert "next" in body and "i" not in body
  assert len(body) == 6
  assert m.instruction_count == 4 + 6 + 2 + 2 + 2 + 11
  with pytest.raises(KeyError, match="no computation 'nope'"):
    m.computation("nope")
  with pytest.raises(KeyError, match="no instruction 'nope'"):
    body.instruction("nope")


def test_root_defaults_to_the_last_instruction():
  m = parse_hlo("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n  b = f32[] negate(a)\n}\n")
  assert m.entry.root_name == "b"


def test_parameters_are_ordered_by_number():
  m = parse_hlo("HloModule m\nENTRY e {\n  b = f32[] parameter(1)\n"
                "  a = s32[] parameter(0)\n  ROOT t = (s32[], f32[]) tuple(a, b)\n}\n")
  assert [p.name for p in m.entry.parameters] == ["a", "b"]
  assert [p.parameter_number for p in m.entry.parameters] == [0, 1]
  assert [i.name for i in m.entry.instructions] == ["b", "a", "t"]


def test_entry_defaults_to_the_last_computation():
  m = parse_hlo("HloModule m\nf {\n  ROOT a = f32[] parameter(0)\n}\n"
                "g {\n  ROOT b = s32[] parameter(0)\n}\n")
  assert m.entry_name == "g"
  assert [c.is_entry for c in m.computations] == [False, True]


def test_called_computations_by_role():
  m = parse_hlo(hlo_snippets.CONTROL_FLOW)
  e = m.entry
  assert dict(e.instruction("w").called_computations) == {"condition": ("cond",), "body": ("body",)}
  assert dict(e.instruction("c1").called_computations) == {
      "branch_computations": ("branch0", "branch1")}
  assert dict(e.instruction("c2").called_computations) == {
      "true_computation": ("branch1",), "false_computation": ("branch0",)}
  assert dict(e.instruction("call").called_computations) == {"to_apply": ("branch0",)}
  assert dict(e.instruction("f").called_computations) == {"calls": ("fused",)}
  assert e.instruction("f").fusion_kind == "kLoop"
  assert e.instruction("call").fusion_kind is None
  assert e.instruction("x").called_computations == {}
  assert e.instruction("c2").called_computation_names() == ("branch1", "branch0")
  assert m.callers()["branch0"] == (("main", "c1", "branch_computations"),
                                    ("main", "c2", "false_computation"),
                                    ("main", "call", "to_apply"))


def test_instruction_fields():
  m = parse_hlo(hlo_snippets.SCHEDULED_ASYNC)
  ars = m.entry.instruction("ars")
  assert ars.opcode == "all-reduce-start"
  assert ars.shape == parse_shape("f32[8]{0}")
  assert ars.operands == ("a",)
  assert ars.channel_id == 1
  assert ars.replica_groups == "{{0,1}}"
  assert dict(ars.called_computations) == {"to_apply": ("add",)}
  mul = m.entry.instruction("m")
  assert mul.operands == ("a", "b")
  assert mul.control_predecessors == ("ard", "ad")
  assert m.entry.instruction("b").parameter_number == 1
  assert m.entry.instruction("b").literal is None


def test_async_pairs():
  """Async ops: collective start/done opcodes of their own, the generic
  async-start/done with `calls=`, and `custom-call-start`, which XLA wraps
  in an implicit `async_wrapped` computation (names as jaxlib reports)."""
  m = parse_hlo(hlo_snippets.SCHEDULED_ASYNC)
  assert [c.name for c in m.computations] == ["add", "async_comp", "async_wrapped", "main"]
  e = m.entry
  assert e.instruction("ard").opcode == "all-reduce-done"
  start, done = e.instruction("as"), e.instruction("ad")
  assert (start.opcode, done.opcode) == ("async-start", "async-done")
  assert start.called_computations["calls"] == ("async_comp",)
  assert start.async_wrapped_opcode is None
  ccs, ccd = e.instruction("ccs"), e.instruction("ccd")
  assert (ccs.opcode, ccs.async_wrapped_opcode) == ("async-start", "custom-call")
  assert (ccd.opcode, ccd.async_wrapped_opcode) == ("async-done", "custom-call")
  assert ccs.called_computations["calls"] == ("async_wrapped",)
  assert ccs.backend_config == "opaque"
  wrapped = m.computation("async_wrapped")
  assert [(i.name, i.opcode) for i in wrapped.instructions] == [
      ("async_param", "parameter"), ("custom-call", "custom-call")]
  assert wrapped.root.custom_call_target == "my_kernel"
  assert wrapped.root.operands == ("async_param",)
  assert wrapped.root.shape == parse_shape("f32[8]{0}")
  assert wrapped.instruction("async_param").shape == parse_shape("f32[8]{0}")


def test_constant_literals_are_kept_as_written():
  e = parse_hlo(hlo_snippets.CONSTANTS).entry
  assert e.instruction("s").literal == "1.5"
  assert e.instruction("v").literal == "{1, -2, 3}"
  assert e.instruction("m").literal == "{ { 1, 2 }, { 3, 4 } }"
  assert e.instruction("big").literal == "{...}"
  assert e.instruction("b").literal == "{true, false}"
  assert e.instruction("ninf").literal == "-inf"
  assert e.instruction("big").shape.byte_size == 1024 * 1024 * 2


def test_instructions_are_immutable():
  m = parse_hlo(hlo_snippets.CONTROL_FLOW)
  inst = m.entry.root
  with pytest.raises(dataclasses.FrozenInstanceError):
    inst.name = "other"  # type: ignore[misc]
  with pytest.raises(dataclasses.FrozenInstanceError):
    m.entry.root_name = "x"  # type: ignore[misc]
  with pytest.raises(TypeError):
    m.attributes["is_scheduled"] = "true"  # type: ignore[index]
  with pytest.raises(TypeError):
    inst.attributes["kind"] = "kLoop"  # type: ignore[index]
  assert isinstance(m.computations, tuple)
  assert isinstance(m.entry.instructions, tuple)


def test_modules_compare_by_value():
  """Equal texts make equal modules; offsets do not count, names do."""
  a = parse_hlo(hlo_snippets.CONTROL_FLOW)
  b = parse_hlo("\n\n" + hlo_snippets.CONTROL_FLOW)
  assert a == b
  assert a.entry.root == b.entry.root
  assert hash(a.entry.root) == hash(b.entry.root)
  c = parse_hlo(hlo_snippets.CONTROL_FLOW.replace("direction=LT", "direction=GT"))
  assert a != c


def test_module_keeps_its_text_and_source(tmp_path):
  path = tmp_path / "m.hlo"
  path.write_text(hlo_snippets.NESTED)
  m = hlo_audit.parse_hlo_file(path)
  assert m.source == str(path)
  assert m.text == hlo_snippets.NESTED


# ------------------------------------------------------ metadata, frames ----


def test_metadata_fields():
  e = parse_hlo(hlo_snippets.STACK_FRAMES).entry
  md = e.instruction("e").metadata
  assert md.op_type == "exp"
  assert md.op_name == "jit(f)/exp"
  assert md.stack_frame_id == 2
  assert md.source_file == "" and md.source_line == 0
  md = e.instruction("n").metadata
  assert (md.op_name, md.source_file, md.source_line) == ("jit(f)/neg", "/src/f.py", 7)
  assert e.instruction("p").metadata == hlo_audit.Metadata()


def test_stack_frame_tables():
  idx = parse_hlo(hlo_snippets.STACK_FRAMES).stack_frame_index
  assert idx.file_names == ("model.py", "layers.py")
  assert idx.function_names == ("forward", "dense")
  assert idx.file_locations[1].line == 42
  assert idx.file_locations[1].end_line == 43
  assert idx.file_locations[1].column == 8
  # Printed parent_frame_id is one higher than stored: 1 -> 0 (no caller),
  # 2 -> 1 (frame 1).
  assert [f.parent_frame_id for f in idx.stack_frames] == [0, 1]
  assert [f.file_location_id for f in idx.stack_frames] == [1, 2]


def test_stack_frame_id_resolves_to_a_source_location():
  m = parse_hlo(hlo_snippets.STACK_FRAMES)
  e = m.entry.instruction("e")
  loc = m.source_location(e)
  assert (loc.file, loc.line, loc.column, loc.function) == ("layers.py", 42, 8, "dense")
  assert str(loc) == "layers.py:42"
  stack = m.stack_frame_index.stack(2)
  assert [(s.file, s.line, s.function) for s in stack] == [
      ("layers.py", 42, "dense"), ("model.py", 10, "forward")]
  assert [s.file for s in m.stack_frame_index.stack(1)] == ["model.py"]


def test_source_file_and_line_take_precedence():
  m = parse_hlo(hlo_snippets.STACK_FRAMES)
  loc = m.source_location(m.entry.instruction("n"))
  assert (loc.file, loc.line) == ("/src/f.py", 7)
  assert m.source_location(m.entry.instruction("p")) is None


def test_stack_frame_ids_out_of_range_resolve_to_nothing():
  idx = parse_hlo(hlo_snippets.STACK_FRAMES).stack_frame_index
  assert idx.location(0) is None
  assert idx.location(3) is None
  assert idx.stack(99) == ()


def test_stack_frame_cycles_end():
  """A frame that is its own caller (printed parent one higher) ends the walk."""
  text = hlo_snippets.STACK_FRAMES.replace(
      "2 {file_location_id=2 parent_frame_id=2}",
      "2 {file_location_id=2 parent_frame_id=3}")
  idx = parse_hlo(text).stack_frame_index
  assert idx.stack_frames[1].parent_frame_id == 2
  assert [s.file for s in idx.stack(2)] == ["layers.py"]


def test_op_name_shortcut_agrees_with_metadata():
  """`Instruction.op_name` reads metadata's op_name without decoding."""
  text = ("HloModule m\nENTRY e {\n"
          '  a = f32[] parameter(0), metadata={op_type="p" op_name="jit(f)/\\"a\\""}\n'
          '  b = f32[] negate(a), frontend_attributes={k="metadata={op_name=\\"x\\"}"}\n'
          '  ROOT c = f32[] negate(b), metadata={source_line=3 op_name="jit(f)/c"}\n}\n')
  e = parse_hlo(text).entry
  assert [i.op_name for i in e.instructions] == ['jit(f)/"a"', "", "jit(f)/c"]
  assert [i.metadata.op_name for i in e.instructions] == ['jit(f)/"a"', "", "jit(f)/c"]


@pytest.mark.parametrize("attrs, op_name", [
    ('kind=kLoop, metadata={op_name="good"}', "good"),
    ('backend_config={"a": "{"}, metadata={op_name="good"}', "good"),
    # A `metadata={op_name=...}` inside another value is not the metadata
    # (regression: the shortcut took it).
    ('frontend_attributes={x={y=1, metadata={op_name="evil"}}}', ""),
    ("frontend_attributes={x='a, metadata={op_name=\"evil\"}'}", ""),
    ('backend_config={"a": 1, metadata={op_name="evil"}}', ""),
    ('backend_config={"a": 1, metadata={op_name="evil"}}, metadata={op_name="good"}', "good"),
])
def test_op_name_shortcut_ignores_nested_metadata(attrs, op_name):
  text = f"HloModule m\nENTRY e {{\n  ROOT a = f32[] parameter(0), {attrs}\n}}\n"
  root = parse_hlo(text).entry.root
  assert root.op_name == op_name
  assert root.metadata.op_name == op_name


_PARTIAL_CALL_START = """HloModule test

async_computation {
  p0 = f32[2,3] parameter(0)
  p1 = s32[] parameter(1)
  ROOT abs = f32[2,3] abs(p0)
}

ENTRY main {
  x = f32[2,3] parameter(0)
  ROOT start = ((f32[2,3]), f32[2,3], s32[]) call-start(x), to_apply=async_computation
}
"""


@pytest.mark.parametrize("binds_missing", [False, True])
def test_partially_bound_async_start_follows_the_installed_xla(monkeypatch, binds_missing):
  """jaxlib >= 0.11 gives the wrapper of a partially bound async start the
  unbound parameters too (after the op); 0.10.2 does not. The parser follows
  the installed jaxlib (`compat`), as parity with XLA requires."""
  from hlo_audit._src import compat
  monkeypatch.setattr(compat, "XLA_ASYNC_START_BINDS_MISSING_PARAMS", binds_missing)
  wrapped = parse_hlo(_PARTIAL_CALL_START).computation("async_wrapped")
  got = [(i.name, i.opcode, str(i.shape), i.parameter_number) for i in wrapped.instructions]
  expected = [("async_param", "parameter", "f32[2,3]", 0), ("call", "call", "f32[2,3]", None)]
  if binds_missing:
    expected.append(("async_param.1", "parameter", "s32[]", 1))
  assert [g[:2] for g in got] == [e[:2] for e in expected]
  assert [(g[0], g[3]) for g in got] == [(e[0], e[3]) for e in expected]
  assert [g[2] for g in got] == [e[2] for e in expected]  # each parameter's own shape


def test_op_name_and_role_fast_paths_agree_with_their_patterns():
  """`op_name` finds `metadata={` with `str.find` and `called_computations`
  tests role keys by substring first: both must say what the regular
  expressions they stand in for say."""
  from hlo_audit._src.hlo import ir
  runs = [', metadata={op_name="a/b"}', 'metadata={op_name="q"}', '  , metadata={op_name="v"}',
          ', kind=kLoop, calls=%f, metadata={op_type="add" op_name="x\\"y"}',
          ', frontend_attributes={k="metadata={op_name=\\"z\\"}"}, metadata={op_name="real"}',
          ', x="metadata={op_name=\\"no\\"}"', ',metadata={op_name="w"}', ', a=b', '',
          ', to_apply=%r', ', body=%b, condition=%c', ', branch_computations={%a, %b}',
          ', x="calls=%f"', ', custom_call_target="foo", called_computations={%c}']
  for run in runs:
    reference = ir._OP_NAME.search(run)
    start, m = ir._op_name_match(run)
    assert (start, m and m.group(1)) == (
        (reference.start(), reference.group(1)) if reference else (-1, None)), run
    assert ir._may_call(run) == (ir._ROLE_KEY.search(run) is not None), run


def test_op_name_without_decoding_agrees_with_the_decoded_metadata():
  """`op_name` reads raw runs (a prefix test, then `str.find`): it must say
  what decoding the whole metadata says, escapes and odd orders included."""
  metadata = ['op_name="jit(f)/add"', 'op_name="a\\"b/c"', 'op_type="add" op_name="t/u"',
              'op_name="" source_line=3', 'op_name="x/" source_file="/a/b.py"',
              'source_line=1 op_name="late"']
  lines = [f'  %p{i} = f32[2]{{0}} parameter({i}), metadata={{{m}}}'
           for i, m in enumerate(metadata)]
  lines.append(f'  %k = f32[2]{{0}} add(%p0, %p1), sharding={{replicated}}, '
               f'metadata={{op_name="after/sharding"}}')
  lines.append('  %d = f32[2]{0} reverse(%k), dimensions={0}, metadata={op_name="after/dims"}')
  lines.append('  %n = f32[2]{0} negate(%d), frontend_attributes={x={y=1, '
               'metadata={op_name="nested"}}}')
  lines.append('  ROOT %r = f32[2]{0} add(%n, %p2), metadata={op_name="root"}')
  text = ("HloModule m\n\nENTRY %e (" + ", ".join(
      f"p{i}: f32[2]" for i in range(len(metadata))) + ") -> f32[2] {\n" +
      "\n".join(lines) + "\n}\n")
  from hlo_audit._src.hlo import ir
  in_one_pass = ir.op_names(hlo_audit.parse_hlo(text).entry.instructions)
  insts = list(hlo_audit.parse_hlo(text).entry.instructions)
  fast = [i.op_name for i in insts]  # before anything splits the runs
  assert fast == [i.metadata.op_name for i in insts] == in_one_pass
  assert fast[:3] == ["jit(f)/add", 'a"b/c', "t/u"]
  assert fast[-4:] == ["after/sharding", "after/dims", "", "root"]
  # Runs another attribute's read has split: the raw metadata value is read
  # the same way, and only the odd forms decode it.
  split = list(hlo_audit.parse_hlo(text).entry.instructions)
  for i in split:
    i.attributes
  assert [i.op_name for i in split] == fast
  assert [i for i, inst in enumerate(split)
          if "metadata" in (inst._cache or {})] == [1, 2, 5]


@pytest.mark.parametrize("attrs", [
    "dimensions={1}", "dimensions={}", "dimensions={0,1}, metadata={op_name=\"a\"}",
    'metadata={op_name="x, dimensions={5}"}, dimensions={0}',
    "frontend_attributes={k={dimensions={7}}}, dimensions={1}",
    "dimensions={1}, frontend_attributes={k={dimensions={7}}}",
    "dimensions={01}", "dimensions={1,}", "sharding={replicated}, dimensions={1}",
    'backend_config="x, dimensions={5},"', 'backend_config="x, dimensions={5},", dimensions={1}',
    'backend_config={"a":{"b":[1,2]}}, dimensions={1}', "dimensions={1},  sharding={maximal device=0}",
    # Strings before the key: XLA writes backend configs after metadata.
    'dimensions={1}, metadata={op_name="a"}, backend_config={"x":1}',
    'dimensions={1}, metadata={op_name="a, backend_config={1},"}',
    'dimensions={1}, metadata={op_name="a\\"b"}, backend_config={"x":1}',
    # An escaped quote evens the count before a key that only its string holds.
    'dimensions={1}, metadata={op_name="a\\"}, sharding={replicated}, b"}',
    'dimensions={1}, frontend_attributes={k="}"}, backend_config={"x":1}',
    'dimensions={1}, frontend_attributes={k="{", x={y=1, backend_config={1}, z=2}}',
])
def test_attributes_read_before_the_run_is_split_agree_with_the_split(attrs):
  """`Instruction.attribute` reads the unsplit run where that is exact: the
  same raw values (and decoded dimensions), or the same error, as reading
  them from the split attributes."""
  text = ("HloModule m\nENTRY e {\n  p = f32[2,2] parameter(0)\n"
          f"  ROOT t = f32[2,2] transpose(p), {attrs}\n}}\n")

  def read(split_first):
    try:
      root = parse_hlo(text).entry.root
    except HloParseError:
      return "parse error"
    try:
      if split_first:
        root.attributes  # noqa: B018 - splits the run
      keys = ("dimensions", "backend_config", "sharding", "metadata", "frontend_attributes",
              "kind", "absent")
      return [root.attribute(k) for k in keys], root.dimensions
    except HloParseError as e:
      return f"error: {e.message}"
  assert read(False) == read(True)


def _fixture_modules():
  here = pathlib.Path(__file__).resolve().parents[1] / "real_models"
  return sorted(here.glob("h200/*.hlo.gz"))[:4] + sorted(here.glob("cpu/*.hlo.gz"))[:4]


@pytest.mark.parametrize("path", _fixture_modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_attribute_of_real_compiles_reads_as_the_split_reads_it(path):
  """On XLA's own output (the committed compiles): every key of every
  instruction, and a key it lacks, read from the unsplit run as the split
  reads them."""
  from hlo_audit._src.hlo import ir
  text = gzip.decompress(path.read_bytes()).decode()
  checked = 0
  for comp in parse_hlo(text).computations:
    for inst in comp.instructions:
      run = inst.attribute_source
      if not isinstance(run, str):
        continue  # (the parser's slow path splits as it reads)
      expected = inst.attributes
      for key in (*expected, "absent", "dimensions", "calls"):
        unsplit = ir.Instruction(name=inst.name, opcode=inst.opcode, shape=inst.shape,
                                 attribute_source=run)
        assert unsplit.attribute(key) == expected.get(key), (inst.name, key)
        checked += 1
  assert checked > 1000


@pytest.mark.parametrize("run", [
    ', kind=kLoop, calls=%fused.1, metadata={op_name="a"}', ", to_apply=%add",
    ", condition=%c, body=%b", ", body=%b, condition=%c", ", to_apply=%r.1, dimensions={0}",
    ', metadata={op_name="x, calls=%evil,"}, calls=%good',
    ", frontend_attributes={k={v=1, calls=%evil}}, calls=%good",
    ", calls=%good, frontend_attributes={k={v=1, calls=%evil}}",
    ", branch_computations={%a, %b}", ", calls=%a, calls=%b", ", calls=fused",
    ', custom_call_target="foo", called_computations={%c}', ", scatter=%s, select=%t",
    ', custom_call_target="x, calls=%evil,"', ", frontend_attributes={k={ calls=%evil, v=1}}",
    ", frontend_attributes={k=1, calls=%evil, v=1}",
])
def test_called_computations_read_before_the_run_is_split_agree_with_the_split(run):
  """`called_computations` reads `%name` roles from the unsplit run where
  that is exact: the same names (in role order), or the same error."""
  from hlo_audit._src.hlo import attributes, ir

  def read(source):
    try:
      inst = ir.Instruction(name="i", opcode="fusion", shape=None,
                            attribute_source=source() if callable(source) else source)
      return dict(inst.called_computations)
    except HloParseError as e:
      return f"error: {e.message}"
  assert read(run) == read(lambda: attributes.split_attributes(run))


@pytest.mark.parametrize("run", [", dimensions={1}x", ", dimensions={1}, dimensions={2}",
                                 # A repeated key whose first blanks are not ", ".
                                 ",  dimensions={1}, dimensions={2}",
                                 ", kind=kLoop, dimensions={1} , metadata={}"])
def test_an_attribute_of_a_run_the_split_rejects_is_no_value_either(run):
  """An unsplit run the parser did not take whole (built by hand): what the
  split says of it, an error or the value past blanks, is what is read."""
  from hlo_audit._src.hlo import attributes, ir

  def read(source):
    try:
      return ir.Instruction(name="i", opcode="transpose", shape=None,
                            attribute_source=source).attribute("dimensions")
    except HloParseError:
      return "error"
  try:
    expected = attributes.split_attributes(run).get("dimensions")
  except HloParseError:
    expected = "error"
  assert read(run) == expected


def test_an_attribute_asked_again_is_read_once(monkeypatch):
  """`Instruction.attribute` keeps what it read from the unsplit run: analyses
  ask a fusion's kind again and again."""
  from hlo_audit._src.hlo import ir
  m = parse_hlo("""HloModule m
ENTRY main {
  x = f32[8] parameter(0)
  ROOT n = f32[8] negate(x), metadata={op_name="jit(f)/neg"}
}
""")
  inst = m.entry.instruction("n")
  reads = []
  unsplit = ir._unsplit_value
  monkeypatch.setattr(ir, "_unsplit_value", lambda *a: reads.append(a) or unsplit(*a))
  first = inst.attribute("metadata")
  assert first is not None and inst.attribute("metadata") == first
  assert len(reads) == 1

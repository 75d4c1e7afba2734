"""Source attribution: the user's frame, library frames as context."""

from __future__ import annotations

import textwrap

import pytest

import hlo_audit
from hlo_audit import SourceLocation
from hlo_audit._src.analysis import source

SITE = "/venv/lib/python3.12/site-packages"
LINEAR = SourceLocation(f"{SITE}/flax/nnx/nn/linear.py", 422, function="Linear.__call__")
NORMALIZE = SourceLocation(f"{SITE}/flax/nnx/nn/normalization.py", 80, function="_normalize")
MODEL = SourceLocation("/home/me/proj/model.py", 27, function="Block.__call__")
STEP = SourceLocation("/home/me/proj/train.py", 9, function="train_step")
JAX = SourceLocation("/src/jax/jax/_src/numpy/lax_numpy.py", 5, function="matmul")
STDLIB = SourceLocation("/usr/lib/python3.12/contextlib.py", 81, function="inner")
CAPTURE = SourceLocation("/repo/hlo_audit/_src/capture/capture.py", 132, function="capture")


@pytest.mark.parametrize("loc", [LINEAR, NORMALIZE, JAX, STDLIB, CAPTURE,
                                 SourceLocation("/usr/lib/python3/dist-packages/x/y.py", 1),
                                 SourceLocation("<frozen runpy>", 1)])
def test_library_frames(loc):
  assert source.is_library(loc.file)


@pytest.mark.parametrize("loc", [MODEL, STEP,
                                 SourceLocation("/repo/tests/hlo_audit/real_models/m.py", 3),
                                 SourceLocation("model.py", 1)])
def test_user_frames(loc):
  assert not source.is_library(loc.file)


def test_innermost_user_frame_wins_over_library_frames():
  stack = (NORMALIZE, LINEAR, MODEL, STEP, CAPTURE)
  assert source.user_frame(stack) == MODEL
  assert source.context(MODEL, stack) == \
      "in flax Linear.__call__ at nnx/nn/linear.py:422"


def test_no_user_frame_falls_back_to_innermost():
  stack = (LINEAR, JAX, CAPTURE)
  assert source.user_frame(stack) == LINEAR
  assert source.context(LINEAR, stack) == ""
  assert source.user_frame(()) is None


def test_user_paths_override_and_library_paths_extend():
  stack = (LINEAR, MODEL)
  assert source.user_frame(stack, user_paths=(r"/flax/",)) == LINEAR
  assert source.user_frame(
      stack, library_paths=source.DEFAULT_LIBRARY_PATHS + (r"/proj/model\.py$",)) == stack[0]
  with pytest.raises(ValueError, match="bad source path pattern"):
    source.is_library("x.py", library_paths=("(",))


_HLO = textwrap.dedent("""\
    HloModule m, entry_computation_layout={(f32[64,64]{1,0})->f32[64,64]{1,0}}

    FileNames
    1 "/home/me/proj/model.py"
    2 "/venv/lib/python3.12/site-packages/flax/linen/linear.py"

    FunctionNames
    1 "MLP.__call__"
    2 "Dense.__call__"

    FileLocations
    1 {file_name_id=1 function_name_id=1 line=27 end_line=27 column=4 end_column=9}
    2 {file_name_id=2 function_name_id=2 line=287 end_line=287 column=4 end_column=9}

    StackFrames
    1 {file_location_id=1 parent_frame_id=1}
    2 {file_location_id=2 parent_frame_id=2}

    ENTRY e {
      p = f32[64,64]{1,0} parameter(0)
      t = f32[64,64]{1,0} tanh(p), metadata={op_name="jit(f)/tanh" stack_frame_id=2}
      ROOT d = f32[64,64]{1,0} dot(t, p), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general" source_file="/venv/lib/python3.12/site-packages/flax/linen/linear.py" source_line=287}
    }
    """)


def test_audit_cites_the_users_line_and_keeps_the_stack():
  m = hlo_audit.parse_hlo(_HLO)
  t = m.entry.instruction("t")
  src, stack = source.attribute(m, t)
  assert (src.file, src.line) == ("/home/me/proj/model.py", 27)
  assert [loc.line for loc in stack] == [287, 27]
  # Only a library file in the metadata: no user frame to prefer.
  src, stack = source.attribute(m, m.entry.instruction("d"))
  assert src.line == 287 and len(stack) == 1
  r = hlo_audit.audit_hlo(_HLO, options=hlo_audit.AuditOptions(user_paths=(r"/flax/",)))
  k = {k.name: k for k in r.kernels}
  assert "linear.py" in k["t"].source.file  # flax declared the user's own code


def test_built_in_examples_are_user_code_even_when_installed():
  example = f"{SITE}/hlo_audit/_src/examples/transformer.py"
  assert not source.is_library(example)
  assert source.is_library(f"{SITE}/hlo_audit/_src/audit.py")


_LOOP = textwrap.dedent("""\
    HloModule m, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

    body {
      p = (s32[], f32[8]{0}) parameter(0)
      i = s32[] get-tuple-element(p), index=0
      x = f32[8]{0} get-tuple-element(p), index=1
      c = f32[8]{0} copy(x)
      t = f32[8]{0} tanh(c), metadata={op_name="tanh" source_file="/home/me/proj/model.py" source_line=12}
      one = s32[] constant(1)
      j = s32[] add(i, one)
      ROOT r = (s32[], f32[8]{0}) tuple(j, t)
    }

    cond {
      p = (s32[], f32[8]{0}) parameter(0)
      i = s32[] get-tuple-element(p), index=0
      n = s32[] constant(4)
      ROOT lt = pred[] compare(i, n), direction=LT
    }

    ENTRY e {
      a = f32[8]{0} parameter(0)
      cp = f32[8]{0} copy(a)
      z = s32[] constant(0)
      init = (s32[], f32[8]{0}) tuple(z, cp)
      w = (s32[], f32[8]{0}) while(init), condition=cond, body=body, metadata={op_name="scan" source_file="/home/me/proj/model.py" source_line=30}
      ROOT out = f32[8]{0} get-tuple-element(w), index=1
    }
    """)


def test_instructions_without_metadata_take_their_loop_or_readers_line():
  m = hlo_audit.parse_hlo(_LOOP)
  carry_copy = m.computation("body").instruction("c")
  src, stack = source.attribute(m, carry_copy)
  assert src.line == 30 and stack  # the while that runs the body
  init_copy = m.entry.instruction("cp")
  assert source.attribute(m, init_copy)[0].line == 30  # through the tuple to the while
  assert source.attribute(m, m.computation("cond").instruction("n"))[0].line == 30


_FUSED = """
HloModule fused, is_scheduled=true

%fused_gelu (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %m = f32[64,128]{1,0} multiply(%p0, %p0), metadata={op_name="jit(f)/mul" source_file="/home/me/proj/model.py" source_line=12}
  ROOT %t = f32[64,128]{1,0} tanh(%m), metadata={op_name="jit(f)/tanh" source_file="/home/me/proj/model.py" source_line=13}
}

ENTRY %main (x: f32[64,128]) -> f32[64,128] {
  %x = f32[64,128]{1,0} parameter(0)
  ROOT %f = f32[64,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_gelu
}
"""


def test_a_fusion_without_metadata_takes_its_fused_roots_line():
  m = hlo_audit.parse_hlo(_FUSED)
  src, _ = source.attribute(m, m.entry.instruction("f"))
  assert (src.file, src.line) == ("/home/me/proj/model.py", 13)

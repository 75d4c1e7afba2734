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

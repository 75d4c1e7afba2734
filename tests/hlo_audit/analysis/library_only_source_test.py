"""The source of a fusion whose every frame is a library's: the fusion's own
innermost frame, not one of its fused instructions'."""

from __future__ import annotations

import textwrap

import hlo_audit
from hlo_audit._src.analysis import source

# Three stacks, all inside installed packages: the fusion's own (flax Dense,
# called from optax), its fused root's and another fused instruction's
# (gelu, tanh; also called from optax). XLA writes parent_frame_id as the
# parent's id + 1 (0: none).
MODULE = textwrap.dedent("""\
    HloModule m, is_scheduled=true, entry_computation_layout={(f32[64,64]{1,0})->f32[64,64]{1,0}}

    FileNames
    1 "/venv/lib/python3.12/site-packages/flax/linen/linear.py"
    2 "/venv/lib/python3.12/site-packages/optax/_src/transform.py"
    3 "/venv/lib/python3.12/site-packages/flax/linen/activation.py"
    4 "/venv/lib/python3.12/site-packages/jax/_src/numpy/ufuncs.py"

    FunctionNames
    1 "Dense.__call__"
    2 "update_fn"
    3 "gelu"
    4 "tanh"

    FileLocations
    1 {file_name_id=1 function_name_id=1 line=287 end_line=287 column=4 end_column=9}
    2 {file_name_id=2 function_name_id=2 line=90 end_line=90 column=4 end_column=9}
    3 {file_name_id=3 function_name_id=3 line=51 end_line=51 column=4 end_column=9}
    4 {file_name_id=4 function_name_id=4 line=7 end_line=7 column=4 end_column=9}

    StackFrames
    1 {file_location_id=2 parent_frame_id=1}
    2 {file_location_id=1 parent_frame_id=2}
    3 {file_location_id=3 parent_frame_id=2}
    4 {file_location_id=4 parent_frame_id=2}

    %fused_gelu (param_0: f32[64,64]) -> f32[64,64] {
      %param_0 = f32[64,64]{1,0} parameter(0)
      %tanh.0 = f32[64,64]{1,0} tanh(%param_0), metadata={op_name="jit(f)/tanh" stack_frame_id=4}
      ROOT %mul.0 = f32[64,64]{1,0} multiply(%tanh.0, %param_0), metadata={op_name="jit(f)/mul" stack_frame_id=3}
    }

    ENTRY %main (p: f32[64,64]) -> f32[64,64] {
      %p = f32[64,64]{1,0} parameter(0)
      ROOT %gelu_fusion = f32[64,64]{1,0} fusion(%p), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(f)/mul" stack_frame_id=2}
    }
    """)


def test_the_fusions_own_innermost_frame_is_its_source():
  m = hlo_audit.parse_hlo(MODULE)
  src, stack = source.attribute(m, m.entry.instruction("gelu_fusion"))
  assert (src.file.rsplit("/", 1)[-1], src.line) == ("linear.py", 287)
  # The stack it came from is the fusion's: flax Dense, called from optax.
  assert [(loc.file.rsplit("/", 1)[-1], loc.line) for loc in stack] == [
      ("linear.py", 287), ("transform.py", 90)]
  assert source.context(src, stack) == ""  # the source is the innermost frame


def test_the_report_cites_the_fusions_frame():
  r = hlo_audit.audit_hlo(MODULE)
  (k,) = [k for k in r.kernels if k.name == "gelu_fusion"]
  assert (k.source.file.rsplit("/", 1)[-1], k.source.line) == ("linear.py", 287)

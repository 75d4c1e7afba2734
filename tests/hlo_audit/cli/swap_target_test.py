"""`hlo-audit example --swap --target h200`: both programs compiled for an
H200 on this machine, and the target check (kernels compiled, the what-if
held against XLA's footprint of the swapped program).

The swap is planned and built for the H200 (its kernels as custom calls in
the compiled program); the same plan, interpreted, runs here for the
numerics gate."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from hlo_audit._src.analysis.kernel_library import installed_libraries
from hlo_audit._src.cli import main
from hlo_audit._src.cli.swap_cmd import WHAT_IF_TOLERANCE, TargetCheck
from tests.gpu_target import require_gpu_target

def _check(**kw) -> TargetCheck:
  base = dict(target="h200", swapped_ops=6, compiled_kernels=6, interpreted_kernels=0,
              fused=4, unsplit=0, baseline_peak=1000, predicted_peak=900, measured_peak=920)
  return TargetCheck(**{**base, **kw})


def test_the_target_check_needs_kernels_and_a_close_prediction():
  assert _check().passed and _check().error == pytest.approx(-20 / 920)
  no_kernels = _check(compiled_kernels=0, interpreted_kernels=6)
  assert not no_kernels.passed and not no_kernels.kernels_compiled
  assert "FAIL, the swapped program holds none" in no_kernels.lines()[0]
  off = _check(measured_peak=int(900 / (1 + 2 * WHAT_IF_TOLERANCE)))
  assert not off.passed and "FAIL" in off.lines()[1]
  assert not _check(measured_peak=None).passed
  assert _check(swapped_ops=0, compiled_kernels=0).kernels_compiled


def test_split_k_gemms_are_unsplit_at_the_replaced_lines_only():
  # A buffer's user frame, or a library frame of its stack, names the line;
  # a file matches by its path's tail (the swap's trace and XLA's metadata
  # may spell it from different roots).
  from types import SimpleNamespace as NS

  from hlo_audit._src.cli.swap_cmd import _at

  loc = lambda file, line: NS(file=file, line=line)
  user = NS(source=loc("/src/model.py", 12), source_stack=(loc("/lib/flax/linear.py", 40),))
  assert _at(user, [("model.py", 12)]) and _at(user, [("/src/model.py", 12)])
  assert _at(user, [("/site/lib/flax/linear.py", 40)])
  assert not _at(user, [("/src/model.py", 13)]) and not _at(user, [("/src/other.py", 12)])
  assert not _at(user, [("del.py", 12)])  # a tail, not a suffix of the name
  assert not _at(NS(source=None, source_stack=()), [("model.py", 12)])


def _swap(*extra: str):
  require_gpu_target()
  if not installed_libraries().libraries:
    pytest.skip("--swap needs a kernel library (pip install -e .: pallas_kernels)")
  out, err = io.StringIO(), io.StringIO()
  with redirect_stdout(out), redirect_stderr(err):
    # The example at its own sizes, as `hlo-audit example --swap --target h200`
    # runs it (at toy sizes interpret-mode loops outweigh what the swap saves).
    code = main.run(["example", "--swap", "--target", "h200", "--json", *extra])
  return code, json.loads(out.getvalue()), err.getvalue()


@pytest.fixture(scope="module")
def swap_json():
  return _swap()


@pytest.mark.slow
def test_a_bf16_swap_holds_mosaic_gpu_matmuls_on_the_h200():
  # bf16 matmuls take the Mosaic GPU kernel on a Hopper target; the fused
  # dAct + bias-gradient pass of their backward stays Triton's, as do the
  # row ops. (f32 weights stored [K, N] stay on Triton: TF32 wgmma reads
  # K-major operands only.)
  code, d, _ = _swap("--set", "dtype=bfloat16")
  kinds = d["target_check"]["kernel_kinds"]
  assert kinds.get("Pallas/Mosaic GPU", 0) >= 4 and kinds.get("Pallas/Triton GPU", 0) > 0, kinds
  gates = {g["name"]: g["status"] for g in d["verification"]["gates"]}
  assert gates["numerics"] == "pass" and gates["kernels ran"] == "pass", gates
  # The what-if is judged and said (-2.3% on jax 0.12; on 0.11 XLA schedules
  # three unswapped weight gradients' split-K gemms together: -6.6%).
  check = d["target_check"]
  assert check["unsplit"] > 0 and check["error"] is not None, check
  assert (code == main.ExitCode.OK) == check["passed"], (code, check)


@pytest.mark.slow
def test_swap_compiles_both_programs_for_the_h200(swap_json):
  _, d, _ = swap_json
  assert d["before"]["target"] == d["after"]["target"] == "h200"
  assert d["before"]["platform"] == d["after"]["platform"] == "gpu"
  gates = {g["name"]: g["status"] for g in d["verification"]["gates"]}
  assert gates["numerics"] == "pass" and gates["intermediates removed"] == "pass"
  # Fewer kernel launches, and the fusions gone, in XLA:GPU's program.
  assert d["diff"]["launches_delta"] < 0
  check = d["target_check"]
  assert check["target"] == "h200" and check["swapped_ops"] >= 4
  assert check["fused"] > 0 and check["measured_peak"] and check["predicted_peak"]


@pytest.mark.slow
def test_the_what_if_is_within_5_percent_of_the_swapped_h200_program(swap_json):
  # The swap closes findings and replaces XLA's split-K gemms (forward, and
  # dx/dw in its kernels' VJPs): fusing alone predicted +24%.
  _, d, _ = swap_json
  check = d["target_check"]
  assert check["compiled_kernels"] > 0 and check["unsplit"] > 0, check
  assert abs(check["error"]) <= WHAT_IF_TOLERANCE, check
  assert check["passed"]


@pytest.mark.slow
def test_the_attention_chain_is_planned_for_the_h200(swap_json):
  # This CPU's plan keeps the f32 chain XLA's (its softmax the softmax
  # kernel's); the H200's routes it to JAX's Pallas attention kernel, which
  # the swapped program holds (cuDNN takes bf16 and f16 only).
  _, d, _ = swap_json
  sites = [s for s in d["swap"]["sites"] if s["kernel"] == "jax.nn.dot_product_attention"]
  assert sites and all(s["replaced"] for s in sites), sites
  gates = {g["name"]: g for g in d["verification"]["gates"]}
  assert gates["kernels ran"]["status"] == "pass"
  # The program compiled for the H200 is judged as compiled: no discount
  # for interpreted kernels' padding in its peak.
  assert not any("interpreted kernels" in x for x in gates["peak memory"]["details"])


@pytest.mark.slow
def test_the_exit_code_follows_the_target_check(swap_json):
  code, d, err = swap_json
  check = d["target_check"]
  if check["passed"]:
    assert code == main.ExitCode.OK
  else:
    assert code == main.ExitCode.FINDINGS and "target check failed on h200" in err


@pytest.mark.slow
def test_the_swapped_h200_program_holds_the_kernels(swap_json):
  _, d, _ = swap_json
  check = d["target_check"]
  assert check["kernels_compiled"] is True
  assert check["compiled_kernels"] >= check["swapped_ops"] > 0
  assert check["interpreted_kernels"] == 0

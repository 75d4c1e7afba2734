"""The hlo-audit command line: verbs, outputs and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hlo_audit._src.cli.common import ExitCode
from hlo_audit._src.cli.main import run

SMALL = ["--set", "batch=2", "--set", "seq=32", "--set", "d_model=64",
         "--set", "heads=2", "--set", "d_ff=128"]

HLO = """HloModule m, is_scheduled=true
ENTRY %main (x: f32[64,64], w: f32[64,64]) -> f32[64,64] {
  %x = f32[64,64]{1,0} parameter(0)
  %w = f32[64,64]{1,0} parameter(1)
  %d = f32[64,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[64,64]{1,0} tanh(%d)
}
"""


def test_example_json(capsys):
  assert run(["example", "--json", *SMALL]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["name"] == "jit_train_step" and d["findings"]


def test_example_fail_on(capsys):
  assert run(["example", "--markdown", "--fail-on", "unfused-epilogue", *SMALL]) == ExitCode.FINDINGS
  assert "finding(s) of class unfused-epilogue" in capsys.readouterr().err


def test_file_terminal_and_html(tmp_path, capsys):
  p = tmp_path / "m.hlo"
  p.write_text(HLO)
  html = tmp_path / "r.html"
  assert run(["file", str(p), "--html", str(html), "--width", "150"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert "unfused epilogue" in out and html.exists()


def test_run_module_function(tmp_path, capsys):
  (tmp_path / "model.py").write_text(
      "import jax.numpy as jnp\n"
      "def forward(x, w):\n"
      "    return jnp.tanh(x @ w)\n")
  code = run(["run", f"{tmp_path / 'model.py'}:forward", "--arg", "f32[8,128]",
              "--arg", "f32[128,256]", "--json"])
  assert code == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["name"] == "jit_forward"


def test_diff_of_saved_json_and_file(tmp_path, capsys):
  p = tmp_path / "m.hlo"
  p.write_text(HLO)
  assert run(["file", str(p), "--json"]) == ExitCode.OK
  saved = tmp_path / "a.json"
  saved.write_text(capsys.readouterr().out)
  assert run(["diff", str(saved), str(p)]) == ExitCode.OK
  assert "no kernel, buffer or finding changed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["file", "/no/such/path"], "no such file or folder"),
    (["run", "nocolon"], "expected MODULE:FUNCTION"),
    (["run", "os:path", "--arg", "f99[2]"], "unknown element type"),
    (["example", "--set", "nope=3"], "expected NAME=VALUE"),
    (["example", "--fail-on", "bogus"], "unknown finding class"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
  assert run(argv) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


def test_parse_error_in_file_gives_line_and_column(tmp_path, capsys):
  p = tmp_path / "bad.hlo"
  p.write_text(HLO.replace("tanh(%d)", "tanh(%d"))
  assert run(["file", str(p)]) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert "bad.hlo:6:" in err and "Traceback" not in err


def test_console_script_is_installed():
  exe = os.path.join(os.path.dirname(sys.executable), "hlo-audit")
  out = subprocess.run([exe, "--help"], capture_output=True, text=True)
  assert out.returncode == 0 and "example" in out.stdout


STEP = """
import jax.numpy as jnp

def step(w, x):
  return w * jnp.mean(jnp.tanh(x @ w))
"""


def test_run_what_if_prints_the_replayed_peak(tmp_path, capsys):
  (tmp_path / "train.py").write_text(STEP)
  target = f"{tmp_path / 'train.py'}:step"
  args = ["run", target, "--arg", "f32[512,512]", "--arg", "f32[64,512]", "--width", "400"]
  assert run([*args, "--what-if", "donate=0"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert "what-if (donate w): " in out and "what-if: donate w" in out
  assert run([*args, "--json", "--what-if", "donate=w"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  # The output reuses w's 1 MiB.
  assert d["what_if"]["peak_saved"] == 512 * 512 * 4
  (f,) = [f for f in d["findings"] if f["class"] == "undonated-argument"]
  assert f["suggestion"] == "jax.jit(step, donate_argnums=(0,))" and f["ops"] == ["w"]
  assert run([*args, "--what-if", "donate=nope"]) == ExitCode.USAGE
  assert "no argument 'nope'" in capsys.readouterr().err
  assert run([*args, "--what-if", "shrink=1"]) == ExitCode.USAGE


def test_devices_flag_compiles_the_example_data_parallel():
  # A fresh interpreter: the device count must be set before JAX starts.
  code = ("import sys; from hlo_audit._src.cli.main import run; "
          "sys.exit(int(run(['example', '--devices', '2', '--json', '--set', 'batch=2', "
          "'--set', 'seq=32', '--set', 'd_model=64', '--set', 'heads=2', "
          "'--set', 'd_ff=128'])))")
  env = dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  d = json.loads(out.stdout)
  assert [c["opcode"] for c in d["collectives"]] == ["all-reduce"]
  assert d["collectives"][0]["group_size"] == 2
  assert abs(d["peak_bytes"] - d["xla_peak_bytes"]) <= 0.01 * d["xla_peak_bytes"]

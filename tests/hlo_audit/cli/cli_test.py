"""The hlo-audit command line: verbs, outputs and exit codes."""

from __future__ import annotations

import json
import re
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


def test_fail_on_names_the_offending_classes_in_alphabetical_order(capsys):
  # The stderr headline is stable whatever order --fail-on named the classes
  # in (CI logs and greps compare it).
  assert run(["example", "--json", "--fail-on", "unfused-prologue,layout-conflict",
              *SMALL]) == ExitCode.FINDINGS
  err = capsys.readouterr().err
  assert "finding(s) of class layout-conflict, unfused-prologue (--fail-on):" in err, err


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


@pytest.mark.parametrize("content, message", [
    (b"", "empty file, not HLO text"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 30, "binary file, not HLO text"),
    (b'{"not": "hlo"}\n', "not HLO text (no HloModule header"),
    (HLO.replace("tanh(%d)", "tanh(%y)").encode(),
     "in.hlo:6:34: operand y is not defined: no instruction of that name before this use"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, capsys, content, message):
  p = tmp_path / "in.hlo"
  p.write_bytes(content)
  assert run(["file", str(p)]) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
  assert "unknown opcode" not in err
  if b"%y" in content:
    assert run(["file", str(p), "--verbose"]) == ExitCode.USAGE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and lines[2].strip() == "ROOT %t = f32[64,64]{1,0} tanh(%y)"
    assert lines[3].strip() == "^"


def test_a_module_without_its_header_line_is_still_hlo(tmp_path, capsys):
  # A computation pasted without `HloModule ...` (as XLA's dumps quote one):
  # its ENTRY and instructions make it HLO text, which the parser takes.
  p = tmp_path / "entry.hlo"
  p.write_text("ENTRY e {\n  p = f32[2]{0} parameter(0)\n  ROOT n = f32[2]{0} negate(p)\n}\n")
  assert run(["file", str(p)]) == ExitCode.OK
  assert "2 instructions, 1 kernels" in capsys.readouterr().out
  # Mistyped, it is still HLO: the parser's line and column, not "not HLO".
  p.write_text(p.read_text().replace("negate(p)", "negat(p)"))
  assert run(["file", str(p)]) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert f"{p}:3:" in err and "not HLO text" not in err, err


def test_fail_on_with_min_bytes_prints_the_offending_rows(tmp_path, capsys):
  p = tmp_path / "m.hlo"
  p.write_text(HLO)   # one unfused epilogue of 2 x 64 x 64 x 4 = 32 KiB
  assert run(["file", str(p), "--fail-on", "unfused-epilogue", "--min-bytes", "1MiB"]) == ExitCode.OK
  capsys.readouterr()
  assert run(["file", str(p), "--json", "--fail-on", "unfused-epilogue",
              "--min-bytes", "32KiB"]) == ExitCode.FINDINGS
  cap = capsys.readouterr()
  json.loads(cap.out)                       # stdout stays JSON
  assert "1 finding(s) of class unfused-epilogue saving >= 32.00 KiB (--fail-on)" in cap.err
  assert re.search(r"1\s+32\.00 KiB\s+unfused epilogue\s+f32\[64,64\]", cap.err), cap.err
  assert run(["file", str(p), "--min-bytes", "lots"]) == ExitCode.USAGE


def test_example_default_view_fits_a_screen_with_next_commands(capsys):
  assert run(["example", "--width", "100", *SMALL]) == ExitCode.OK
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert len(lines) <= 60 and max(map(len, lines)) <= 100
  assert re.search(r"Top \d+ of \d+ finding groups", out)
  # The command is too long for 100 columns with its flags: said once.
  assert "Next, add to hlo-audit example " + " ".join(SMALL) + ":" in " ".join(
      l.strip() for l in lines)
  for flag in ("--all", "--html audit.html", "--json", "--swap"):
    assert re.search(rf"^  {flag}\s+\w", out, re.M), flag
  assert run(["example", "--all", "--width", "100", *SMALL]) == ExitCode.OK
  full = capsys.readouterr().out
  assert len(full.splitlines()) > 3 * len(lines) and "Intermediate tensors" in full


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

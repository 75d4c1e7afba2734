"""Careless and hostile input to the CLI: one clear line naming the problem
and where, exit 2, never a traceback and never a silently wrong report."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from hlo_audit._src.cli.common import ExitCode
from hlo_audit._src.cli.main import run
from hlo_audit._src.target import specs
from tests.hlo_audit.cli.cli_test import HLO


def one_error_line(capsys) -> str:
  err = capsys.readouterr().err
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith("hlo-audit: error: ") and "Traceback" not in err
  return lines[0]


# ------------------------------------------------------------ --target ----


def h200_text() -> str:
  return (specs.BUNDLED_DIR / "h200.txtpb").read_text(encoding="utf-8")


def test_target_file_not_utf8_names_the_byte_and_line(tmp_path, capsys):
  p = tmp_path / "gpu.txtpb"
  p.write_bytes(b"gpu_device_info {\n  core_count: 1\xff\n}\n")
  assert run(["example", "--target", str(p)]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert "gpu.txtpb" in line and "0xff" in line and "line 2" in line


@pytest.mark.parametrize("edit, where, what", [
    (("core_count: 132", "core_count 132"), None, "expected ':' or '{'"),
    (("threads_per_warp: 32", "threads_per_warp: \x01"), None, "unexpected character"),
    (("core_count: 132", "core_count: 132 }"), None, "expected a name"),
    (("l2_cache_size: 52428800", 'l2_cache_size: "52428800'), None, "unexpected character"),
])
def test_malformed_spec_gives_line_and_column(tmp_path, capsys, edit, where, what):
  text = h200_text()
  assert edit[0] in text
  bad = text.replace(edit[0], edit[1], 1)
  p = tmp_path / "gpu.txtpb"
  p.write_text(bad, encoding="utf-8")
  # Where the edit is: the error points at that line (the extra brace's
  # fault shows where the spec's own closing brace is left over).
  line_no = text[:text.index(edit[0])].count("\n") + 1
  assert run(["example", "--target", str(p)]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert f"{p}:" in line and "malformed GpuTargetConfigProto" in line and what in line
  reported = int(line.split(f"{p}:", 1)[1].split(":", 1)[0])
  if "}" not in edit[1]:
    assert reported == line_no
  else:
    assert reported > line_no


def test_truncated_spec_says_end_of_file(tmp_path, capsys):
  text = h200_text()
  p = tmp_path / "gpu.txtpb"
  p.write_text(text[:len(text) // 2], encoding="utf-8")
  assert run(["example", "--target", str(p)]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert "end of file" in line and "expected a field or '}'" in line


def test_spec_without_compute_capability_says_what_is_missing(tmp_path, capsys):
  p = tmp_path / "gpu.txtpb"
  p.write_text("gpu_device_info { core_count: 1 }\n", encoding="utf-8")
  assert run(["example", "--target", str(p)]) == ExitCode.USAGE
  assert "no cuda_compute_capability" in one_error_line(capsys)


def test_every_shipped_spec_is_well_formed():
  for path in sorted(specs.BUNDLED_DIR.glob("*.txtpb")):
    specs.check_text_proto(path.read_text(encoding="utf-8"), str(path))
  for spec in specs.plugin_specs():  # the installed plugin's, where it embeds them
    specs.check_text_proto(spec.text, spec.source)


# ---------------------------------------------------------- run factory ----


@pytest.mark.parametrize("body, said", [
    ("return 42", "returned int"),
    ("return None", "returned NoneType"),
    ("return (jax.jit(lambda x: x), 'not args')", "returned (function, str)"),
    ("return jax.jit(lambda x: x)", "returned function"),
    ("return (jax.jit(lambda x: x), (1,), 'kw')", "returned (function, tuple, str)"),
])
def test_factory_returning_something_else_is_an_error(tmp_path, capsys, body, said):
  (tmp_path / "make.py").write_text(f"import jax\ndef make_step():\n  {body}\n")
  assert run(["run", f"{tmp_path / 'make.py'}:make_step"]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert said in line and "(step, args) or (step, args, kwargs)" in line


def test_function_of_no_arguments_computing_arrays_is_the_program(tmp_path, capsys):
  (tmp_path / "prog.py").write_text(
      "import jax.numpy as jnp\n"
      "def prog():\n"
      "  x = jnp.ones((64, 64))\n"
      "  return jnp.tanh(x @ x)\n")
  assert run(["run", f"{tmp_path / 'prog.py'}:prog", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["name"] == "jit_prog"


def test_factory_form_audits_the_step(tmp_path, capsys):
  (tmp_path / "make.py").write_text(
      "import jax, jax.numpy as jnp\n"
      "def make_step():\n"
      "  step = jax.jit(lambda w, x: jnp.tanh(x @ w))\n"
      "  return step, (jnp.ones((32, 32)), jnp.ones((8, 32)))\n")
  assert run(["run", f"{tmp_path / 'make.py'}:make_step", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert any(b["shape"] == "f32[8,32]" for b in d["buffers"])


# ----------------------------------------------------------------- diff ----


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  d = tmp_path_factory.mktemp("diff")
  hlo = d / "m.hlo"
  hlo.write_text(HLO)
  from hlo_audit import audit_hlo
  report = json.loads(audit_hlo(str(hlo)).to_json())
  return d, report


def _changed(report, edit):
  report = json.loads(json.dumps(report))
  edit(report)
  return report


@pytest.mark.parametrize("doc, said", [
    ([1, 2], "a JSON array, not a report"),
    ("text", "a JSON string, not a report"),
    (lambda r: r.update(module=3), "'module': expected an object, got a JSON number"),
    (lambda r: r.update(kernels={}), "'kernels': expected an array, got a JSON object"),
    (lambda r: r["kernels"].__setitem__(0, "x"), "kernels[0]: expected an object, got a "
                                                 "JSON string"),
    (lambda r: r["findings"][0].pop("class"), "findings[0]: missing field 'class'"),
    (lambda r: r["findings"][0].update({"class": "bogus"}),
     "findings[0]: a field has the wrong type or value (unknown finding class 'bogus')"),
    (lambda r: r.update(schema_version=99), "schema_version 99; this hlo-audit reads 1 to"),
    (lambda r: r["buffers"][0].update(dims=5), "buffers[0]: a field has the wrong type"),
])
def test_diff_of_a_json_that_is_not_a_report(saved, capsys, doc, said):
  d, report = saved
  good, bad = d / "good.json", d / "bad.json"
  good.write_text(json.dumps(report))
  bad.write_text(json.dumps(_changed(report, doc) if callable(doc) else doc))
  assert run(["diff", str(good), str(bad)]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert "bad.json" in line and said in line, line
  assert "subscriptable" not in line and "string indices" not in line


def test_diff_of_json_that_does_not_parse_gives_line_and_column(saved, capsys):
  d, _ = saved
  (d / "broken.json").write_text('{\n  "schema_version": 4,\n  oops\n}\n')
  assert run(["diff", str(d / "broken.json"), str(d / "broken.json")]) == ExitCode.USAGE
  assert f"{d / 'broken.json'}:3:3: not valid JSON" in one_error_line(capsys)


def test_diff_of_saved_reports_still_works(saved, capsys):
  d, report = saved
  (d / "a.json").write_text(json.dumps(report))
  assert run(["diff", str(d / "a.json"), str(d / "a.json")]) == ExitCode.OK
  assert "no kernel, buffer or finding changed" in capsys.readouterr().out


# ------------------------------------------------------- dump --module ----


def _dump(tmp_path: pathlib.Path) -> pathlib.Path:
  """A dump with two modules of one name (one function compiled twice)."""
  d = tmp_path / "dump"
  d.mkdir()
  small = HLO
  large = HLO.replace("64", "128")
  (d / "module_0007.jit_f.cpu_after_optimizations.txt").write_text(small)
  (d / "module_0012.jit_f.cpu_after_optimizations.txt").write_text(large)
  return d


def test_modules_sharing_a_name_are_picked_by_id(tmp_path, capsys):
  d = _dump(tmp_path)
  assert run(["file", str(d), "--module", "jit_f"]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert "2 modules named 'jit_f'" in line and "ids 7, 12" in line
  for ident, shape in (("7", "f32[64,64]"), ("12", "f32[128,128]")):
    assert run(["file", str(d), "--module", ident, "--json"]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert {b["shape"] for b in doc["buffers"]} == {shape}, ident


def test_a_number_that_is_no_id_is_a_name_pattern(tmp_path, capsys):
  d = tmp_path / "dump"
  d.mkdir()
  (d / "module_0001.jit_f2.cpu_after_optimizations.txt").write_text(HLO)
  assert run(["file", str(d), "--module", "2", "--json"]) == ExitCode.OK
  assert json.loads(capsys.readouterr().out)["module"]["name"] == "m"


# ------------------------------------------------- errors, pipes, output ----


def test_parse_error_quoting_control_characters_prints_them_escaped(tmp_path, capsys):
  p = tmp_path / "m.hlo"
  p.write_text("HloModule m\nENTRY e {\n  x = f32[2]{0} \x1b[2Jparameter(0)\n}\n")
  assert run(["file", str(p)]) == ExitCode.USAGE
  line = one_error_line(capsys)
  assert "\x1b" not in line and "\\x1b" in line and ":3:" in line


@pytest.mark.parametrize("flags, code", [([], 0), (["--fail-on", "undonated-argument"], 1)])
def test_reader_closing_the_pipe_is_not_an_error(tmp_path, flags, code):
  # As under `| head`: the reader has gone before the report is written (its
  # end of the pipe closed first, so that every write fails, whatever the
  # pipe's buffer size).
  p = tmp_path / "m.hlo"
  p.write_text(HLO)
  r, w = os.pipe()
  os.close(r)
  try:
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "file", str(p), *flags],
                          stdout=w, stderr=subprocess.PIPE, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  finally:
    os.close(w)
  err = proc.stderr.decode()
  # The exit code is the verdict's, as if all had been read: --fail-on's
  # findings still fail (their rows go to stderr).
  assert proc.returncode == code, err
  assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err
  assert ("finding(s) of class undonated-argument" in err) == bool(flags)


@pytest.mark.parametrize("flags, said", [
    (["--fail-on", "bogus"], "unknown finding class"),
    (["--min-time", "5us"], "--min-time applies to --fail-on"),
    (["--top", "-1"], "--top -1: expected"),
    (["--width", "0"], "--width 0: expected a positive number"),
])
def test_output_flags_are_checked_before_any_work(tmp_path, capsys, monkeypatch, flags, said):
  from hlo_audit._src.capture import dump

  def no_work(*args, **kwargs):
    raise AssertionError("the input was read before the flags were checked")

  monkeypatch.setattr(dump, "load_dump", no_work)
  p = tmp_path / "m.hlo"
  p.write_text(HLO)
  assert run(["file", str(p), *flags]) == ExitCode.USAGE
  assert said in one_error_line(capsys)


def test_usage_error_is_one_line(capsys):
  assert run(["file", "x.hlo", "--top", "abc"]) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "invalid int value: 'abc'" in err and "--help" in err


def test_list_with_json_is_json(tmp_path, capsys):
  d = _dump(tmp_path)
  assert run(["file", str(d), "--list", "--json"]) == ExitCode.OK
  rows = json.loads(capsys.readouterr().out)
  assert [(r["id"], r["name"]) for r in rows] == [(7, "jit_f"), (12, "jit_f")]


def test_example_on_devices_the_batch_does_not_divide_grows_it():
  # A fresh interpreter: the device count must be set before JAX starts. The
  # default batch (4) does not divide over 3 devices: it grows to 6; a batch
  # the user sets stays theirs (and fails, saying what to set).
  small = ["--set", "seq=16", "--set", "d_model=32", "--set", "heads=2", "--set", "d_ff=64",
           "--set", "vocab=64"]
  code = ("import sys; from hlo_audit._src.cli.main import run; "
          f"sys.exit(int(run(sys.argv[1:])))")
  env = dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, "-c", code, "example", "--devices", "3", "--json",
                        "--forward-only", *small], capture_output=True, text=True, env=env,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  d = json.loads(out.stdout)
  # Each device's share: 6 / 3 = 2 sequences of 16 tokens, 32 wide.
  assert "f32[2,16,32]" in {b["shape"] for b in d["buffers"]}, \
      sorted({b["shape"] for b in d["buffers"]})
  out = subprocess.run([sys.executable, "-c", code, "example", "--devices", "3",
                        "--set", "batch=4", *small], capture_output=True, text=True, env=env,
                       timeout=600)
  assert out.returncode == 2 and "add --set batch=3" in out.stderr, out.stderr

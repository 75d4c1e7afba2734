"""The command line's GPU target: `--target`, `--gpus`, `--autotune-results`,
`hlo-audit targets`, and `run` with a factory of (step, args)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from hlo_audit._src.cli.common import ExitCode
from hlo_audit._src.cli.main import run
from hlo_audit._src.target import specs, wheels
from tests.gpu_target import gpu_target  # noqa: F401 - the fixture

SMALL = ["--set", "batch=8", "--set", "seq=32", "--set", "d_model=64",
         "--set", "heads=2", "--set", "d_ff=128", "--set", "vocab=64"]

FACTORY = textwrap.dedent('''
    import jax
    import jax.numpy as jnp

    def step(params, batch):
      def loss(params):
        h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)
      grads = jax.grad(loss)(params)
      return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    def make_step():
      params = {"w1": jnp.zeros((64, 128)), "b1": jnp.zeros((128,)),
                "w2": jnp.zeros((128, 8))}
      batch = {"x": jnp.zeros((32, 64)), "y": jnp.zeros((32, 8))}
      return jax.jit(step), (params, batch)
''')


def test_targets_lists_names_and_how_to_get_ready(capsys, monkeypatch):
  monkeypatch.setattr(wheels, "problems", lambda: ["jax-cuda12-plugin is not installed"])
  assert run(["targets"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert "h200" in out and "NVIDIA H200 141GB HBM3e" in out and "h100-sxm (h100)" in out
  assert "not ready: jax-cuda12-plugin is not installed: pip install 'jax-cuda12-plugin==" \
      in out
  assert run(["targets", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["ready"] is False and d["install"].startswith("pip install")
  assert {"name": "h200", "aliases": [], "compute_capability": "9.0"}.items() <= \
      next(t for t in d["targets"] if t["name"] == "h200").items()


def test_targets_names_each_spec_source_once_in_order(capsys, monkeypatch):
  # The plugin's spec for one GPU, hlo-audit's copies for the rest: the
  # "specs:" line lists both sources, sorted, so it reads the same each run.
  h200 = next(s for s in specs.bundled_specs() if s.name == "h200")
  monkeypatch.setattr(specs, "plugin_specs", lambda: (
      dataclasses.replace(h200, source="jax-cuda12-pjrt 9.9"),))
  monkeypatch.setattr(wheels, "problems", lambda: [])
  assert run(["targets"]) == ExitCode.OK
  line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("specs: "))
  sources = line.removeprefix("specs: ").split("; ")
  assert sources == [h200.source, "jax-cuda12-pjrt 9.9"], sources


def test_the_tpu_table_aligns_names_left_and_numbers_right(capsys):
  from hlo_audit._src.target import tpus  # pylint: disable=import-outside-toplevel
  assert run(["targets"]) == ExitCode.OK
  lines = capsys.readouterr().out.splitlines()
  at = next(i for i, l in enumerate(lines) if l.startswith("tpu "))
  head, rows = lines[at], lines[at + 2:at + 2 + len(tpus.GENERATIONS)]
  for g, row in zip(tpus.GENERATIONS, rows):
    assert row.startswith(f"{g.name} ") and f" {g.device_kind} " in row, row
    assert row.index(g.device_kind) == head.index("device"), row  # left
    assert len(row) == len(head), row  # every number ends where its header ends


@pytest.mark.parametrize("argv, message", [
    (["example", "--target", "h900"], "unknown target 'h900': known are"),
    (["example", "--gpus", "8"], "--gpus and --autotune-results need --target"),
    (["example", "--target", "h200", "--devices", "2"], "with --target use --gpus"),
    (["example", "--target", "h200", "--autotune-results", "/nonexistent.txt"],
     "autotune results '/nonexistent.txt': no such file"),
    (["run", "m.py:f", "--target", "h200", "--gpus", "0"], "gpus=0"),
])
def test_bad_target_flags_are_one_line_usage_errors(argv, message, capsys):
  assert run(argv) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1, err


def test_missing_wheels_name_the_pip_command(capsys, monkeypatch):
  monkeypatch.setattr(wheels, "problems", lambda: ["jax-cuda12-pjrt is not installed"])
  assert run(["example", "--target", "h200"]) == ExitCode.USAGE
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1
  assert "jax-cuda12-pjrt is not installed" in err and ": pip install '" in err


def test_run_takes_a_factory_of_step_and_pytree_args(tmp_path, capsys):
  (tmp_path / "train.py").write_text(FACTORY)
  assert run(["run", f"{tmp_path}/train.py:make_step", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["name"] == "jit_step" and "target" not in d["module"]


@pytest.mark.usefixtures("gpu_target")
def test_example_for_an_h200(capsys):
  assert run(["example", "--forward-only", *SMALL, "--target", "h200"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert "on gpu (NVIDIA H200 141GB HBM3e)" in out.splitlines()[0]
  assert "target h200: compiled on this machine, without the device; not autotuned" in out
  # The footer's next commands keep the target.
  assert "--set vocab=64 --target h200:" in out


@pytest.mark.usefixtures("gpu_target")
def test_eight_gpus_shard_the_batch_and_show_the_all_reduces(capsys):
  assert run(["example", *SMALL, "--target", "h200", "--gpus", "8", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["target"] == "8x h200"
  assert any(c["opcode"].startswith("all-reduce") and c["group_size"] == 8
             for c in d["collectives"]), d["collectives"]


@pytest.mark.usefixtures("gpu_target")
def test_run_a_factory_for_an_h200(tmp_path, capsys):
  (tmp_path / "train.py").write_text(FACTORY)
  assert run(["run", f"{tmp_path}/train.py:make_step", "--target", "h200",
              "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  assert d["module"]["platform"] == "gpu" and d["module"]["target"] == "h200"
  assert d["kernels_by_kind"].get("triton gemm fusion")

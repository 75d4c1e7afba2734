"""load_dump(): XLA dump folders from any backend, single files, errors."""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import DumpError

MODULE = """HloModule jit_f, is_scheduled=true
ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %e = f32[4]{0} exponential(%p)
}
"""


@pytest.fixture(scope="module")
def cpu_dump(tmp_path_factory):
  """A real dump folder from compiling on this CPU."""
  d = tmp_path_factory.mktemp("dump")
  f = jax.jit(lambda x: jnp.tanh(x) * 2)
  f.lower(jax.ShapeDtypeStruct((16, 16), jnp.float32)).compile(
      compiler_options={"xla_dump_to": str(d)})
  return str(d)


def test_cpu_dump_lists_and_captures_its_module(cpu_dump):
  dump = hlo_audit.load_dump(cpu_dump)
  assert dump.names() == ("jit__lambda",)
  (m,) = dump.modules
  assert m.stage == "cpu_after_optimizations" and m.platform == "cpu"
  assert m.buffer_assignment_path and m.live_range_path
  c = dump.capture()
  assert c.origin == "dump" and c.buffer_assignment is not None
  assert c.pre_optimization_text is not None
  r = hlo_audit.audit_hlo(cpu_dump)
  assert r.module.name == "jit__lambda"
  assert abs(r.peak_agreement) <= 0.01


def _write(folder, name, text=MODULE):
  with open(os.path.join(folder, name), "w") as f:
    f.write(text)


def test_gpu_and_tpu_style_names_and_timestamps(tmp_path):
  _write(tmp_path, "1700000000.module_0007.jit_step.sm_9.0_gpu_after_optimizations.txt")
  _write(tmp_path, "1700000000.module_0007.jit_step.before_optimizations.txt")
  _write(tmp_path, "module_0003.jit_f.tpu_after_optimizations.txt",
         MODULE.replace("jit_f", "jit_g"))
  _write(tmp_path, "module_0003.jit_f.tpu_after_optimizations-memory-usage-report.txt", "report")
  _write(tmp_path, "module_0003.jit_f.some_pass.txt", "not a module")
  dump = hlo_audit.load_dump(tmp_path)
  by_name = {m.name: m for m in dump.modules}
  assert set(by_name) == {"jit_step", "jit_f"}
  gpu = by_name["jit_step"]
  assert gpu.stage == "sm_9.0_gpu_after_optimizations" and gpu.platform == "gpu"
  assert gpu.timestamp == 1700000000 and gpu.id == 7
  assert gpu.before_optimizations_path is not None
  assert by_name["jit_f"].platform == "tpu"
  assert by_name["jit_f"].memory_usage_report_path is not None
  assert hlo_audit.load_dump(tmp_path, module="step").names() == ("jit_step",)
  c = dump.capture("jit_f")
  assert c.module.name == "jit_g" and c.buffer_assignment is None
  assert any("buffer-assignment" in n for n in c.notes)


def test_single_file(tmp_path):
  p = tmp_path / "m.txt"
  p.write_text(MODULE)
  dump = hlo_audit.load_dump(p)
  assert len(dump) == 1
  assert dump.capture().module.entry.root.opcode == "exponential"


def test_errors(tmp_path):
  with pytest.raises(DumpError, match="no such file or folder"):
    hlo_audit.load_dump(tmp_path / "missing")
  with pytest.raises(DumpError, match="is empty"):
    hlo_audit.load_dump(tmp_path)
  _write(tmp_path, "notes.txt", "hello")
  with pytest.raises(DumpError, match="holds no '\\*after_optimizations.txt' module"):
    hlo_audit.load_dump(tmp_path)
  _write(tmp_path, "module_0001.jit_a.cpu_after_optimizations.txt")
  with pytest.raises(DumpError, match="no module matching 'zzz'.*jit_a"):
    hlo_audit.load_dump(tmp_path, module="zzz")
  # The modules it lists: each name once (both stages of jit_b are one), sorted.
  _write(tmp_path, "module_0003.jit_c.cpu_after_optimizations.txt")
  _write(tmp_path, "module_0002.jit_b.cpu_after_optimizations.txt")
  _write(tmp_path, "module_0002.jit_b.before_optimizations.txt")
  with pytest.raises(DumpError) as e:
    hlo_audit.load_dump(tmp_path, module="zzz")
  assert str(e.value).endswith("; modules: jit_a, jit_b, jit_c")
  with pytest.raises(DumpError, match="not a valid regular expression"):
    hlo_audit.load_dump(tmp_path, module="(")


def test_a_folder_with_no_module_names_what_it_holds_in_order(tmp_path):
  for name in "hgfedcba":  # eight: named in full, sorted
    _write(tmp_path, f"{name}.txt", "x")
  with pytest.raises(DumpError) as e:
    hlo_audit.load_dump(tmp_path)
  assert str(e.value).endswith("It holds: a.txt, b.txt, c.txt, d.txt, e.txt, f.txt, g.txt, h.txt")
  _write(tmp_path, "i.txt", "x")  # a ninth: the first eight, then "..."
  with pytest.raises(DumpError) as e:
    hlo_audit.load_dump(tmp_path)
  assert str(e.value).endswith("It holds: a.txt, b.txt, c.txt, d.txt, e.txt, f.txt, g.txt, h.txt ...")


def test_the_folder_lists_modules_before_and_after_optimizations_by_name(tmp_path):
  from hlo_audit._src.capture.dump import read_dump_dir

  _write(tmp_path, "module_0002.jit_step.v2.before_optimizations.txt")
  _write(tmp_path, "module_0002.jit_step.v2.cpu_after_optimizations.txt")
  found = [(m.name, m.stage) for m in read_dump_dir(str(tmp_path))]
  assert found == [("jit_step.v2", "before_optimizations"),
                   ("jit_step.v2", "cpu_after_optimizations")]


def test_a_folder_dump_keeps_its_path_and_one_match_is_picked(tmp_path):
  _write(tmp_path, "module_0001.jit_train.cpu_after_optimizations.txt")
  _write(tmp_path, "module_0002.jit_eval.cpu_after_optimizations.txt",
         MODULE.replace("jit_f", "jit_e"))
  dump = hlo_audit.load_dump(tmp_path, module="train")
  assert dump.path == str(tmp_path) and dump.names() == ("jit_train",)
  # One module matching is the one picked, by name or by id.
  whole = hlo_audit.load_dump(tmp_path)
  assert whole.select("eval").name == "jit_eval" and whole.select("1").name == "jit_train"


def test_several_matches_are_named_sorted_or_told_apart_by_id(tmp_path):
  _write(tmp_path, "module_0003.jit_b_step.cpu_after_optimizations.txt")
  _write(tmp_path, "module_0001.jit_a_step.cpu_after_optimizations.txt")
  dump = hlo_audit.load_dump(tmp_path)
  with pytest.raises(DumpError) as e:
    dump.select("step")
  assert str(e.value).endswith("matches several modules in " + repr(str(tmp_path))
                               + ": jit_a_step, jit_b_step")
  # The same name compiled twice: the ids tell them apart.
  _write(tmp_path, "module_0004.jit_b_step.cpu_after_optimizations.txt")
  with pytest.raises(DumpError, match=r"matches 2 modules named 'jit_b_step' .*\(ids 3, 4\)"):
    hlo_audit.load_dump(tmp_path).select("b_step")


def test_a_module_without_a_name_is_listed_at_both_stages(tmp_path):
  # XLA names a module after its function; one traced from an unnamed
  # callable gives "module_0001..<stage>.txt": both stages still list it.
  from hlo_audit._src.capture.dump import read_dump_dir

  _write(tmp_path, "module_0001..before_optimizations.txt")
  _write(tmp_path, "module_0001..cpu_after_optimizations.txt")
  found = [(m.name, m.stage) for m in read_dump_dir(str(tmp_path))]
  assert found == [("", "before_optimizations"), ("", "cpu_after_optimizations")]

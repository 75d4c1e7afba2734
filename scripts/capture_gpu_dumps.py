"""Writes XLA:GPU dump folders of small programs, compiled for a GPU target on
this machine (no GPU), as the parser and dump tests' fixtures.

Each program is compiled with `--xla_dump_to` for the target, and the files
an audit reads are kept: the optimized module (`*.sm_9.0a_gpu_after_
optimizations.txt`, which writes a tuple's elements as `%name#N` and async
ops in their long form) and XLA's buffer-assignment, live-range and memory-
usage reports. `index.json` records the versions and `memory_analysis()`'s
footprint of each. Run it once per supported jax, with the plugin wheels.

Example usage:
  JAX_PLATFORMS=cpu python scripts/capture_gpu_dumps.py \
      --out=tests/hlo_audit/capture/gpu_dumps
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_OUT = flags.DEFINE_string("out", None, "Folder to write the dump folders to.")
flags.mark_flag_as_required("out")
_TARGET = flags.DEFINE_string("target", "h200", "The GPU to compile for.")

#: The files of a dump folder an audit reads.
_KEEP = ("_after_optimizations.txt", "_after_optimizations-buffer-assignment.txt",
         "_after_optimizations-live-range.txt",
         "_after_optimizations-memory-usage-report.txt")


def _programs(single, sharded):
  """name -> (jitted function, arguments, target)."""
  import jax
  import jax.numpy as jnp

  s = jax.ShapeDtypeStruct

  def rnn_step(w, xs):
    # A scan (a while loop whose state is a tuple), softmax and normalization
    # reductions (multi-output fusions), and Triton gemms.
    def loss(w):
      def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
      _, hs = jax.lax.scan(body, jnp.zeros((8, 64)), xs)
      y = jax.nn.softmax(hs, axis=-1)
      mu = y.mean(-1, keepdims=True)
      var = ((y - mu) ** 2).mean(-1, keepdims=True)
      return jnp.sum((y - mu) * jax.lax.rsqrt(var + 1e-6))
    return jax.value_and_grad(loss)(w)

  def dp_step(w, x):
    # Data parallel: the weight's gradient is all-reduced over eight GPUs.
    return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

  batch = jax.sharding.NamedSharding(sharded.mesh(), jax.sharding.PartitionSpec("data", None))
  return {
      "rnn_step": (jax.jit(rnn_step), (s((64, 64), jnp.float32), s((6, 8, 64), jnp.float32)),
                   single),
      "dp_step_8gpu": (jax.jit(dp_step), (s((256, 256), jnp.float32),
                                          s((64, 256), jnp.float32, sharding=batch)), sharded),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  import jax
  import jaxlib

  import hlo_audit

  single = hlo_audit.get_target(_TARGET.value)
  sharded = hlo_audit.get_target(_TARGET.value, gpus=8)
  programs = _programs(single, sharded)
  root = pathlib.Path(_OUT.value) / f"jax-{jax.__version__}"
  root.mkdir(parents=True, exist_ok=True)
  index = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
           "target": single.name, "device_kind": single.device_kind, "programs": {}}
  for name, (fn, args, target) in programs.items():
    placed, _ = target.place(args)
    with target.lowering():
      lowered = fn.lower(*placed)
    dump = tempfile.mkdtemp(prefix="hlo_audit_dump_")
    try:
      compiled = lowered.compile(compiler_options={
          "xla_dump_to": dump, "xla_dump_hlo_as_text": True})
      dest = root / name
      shutil.rmtree(dest, ignore_errors=True)
      dest.mkdir()
      for f in sorted(pathlib.Path(dump).iterdir()):
        if f.name.endswith(_KEEP):
          shutil.copy(f, dest / f.name)
    finally:
      shutil.rmtree(dump, ignore_errors=True)
    m = compiled.memory_analysis()
    footprint = (m.argument_size_in_bytes + m.output_size_in_bytes +
                 m.temp_size_in_bytes - m.alias_size_in_bytes)
    index["programs"][name] = {"gpus": target.device_count, "xla_footprint_bytes": footprint}
    print(f"{name}: {sorted(p.name for p in dest.iterdir())}")
  (root / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
  print(f"written to {root}")


if __name__ == "__main__":
  app.run(main)

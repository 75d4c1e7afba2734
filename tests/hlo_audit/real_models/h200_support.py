"""The ground-truth models compiled for an NVIDIA H200 on a machine without
a GPU (a compile-only CUDA topology from XLA's `GpuTargetConfigProto` of the
H200: ../shared/docs/gpu-without-a-gpu.md), and the committed HLO of those
compiles, so the GPU truth also runs where the CUDA plugin is not installed.

`python -m tests.hlo_audit.real_models.h200_support NAME...` rewrites the
fixtures (a model's name, one of `VARIANTS`, `example` or `swapped_example`; needs jax-cuda12-plugin, jax-cuda12-pjrt and nvidia-cuda-nvcc-cu12
at the installed jax's version; run with JAX_PLATFORMS=cpu).
"""

from __future__ import annotations

import functools
import gzip
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent / "h200"
#: XLA's target description of the H200 (as jax-cuda12-plugin 0.12 embeds it).
SPEC = HERE / "h200.txtpb"


def fixture_path(name: str) -> pathlib.Path:
  return HERE / f"{name}.hlo.gz"


def fixture(name: str) -> str:
  """The optimized HLO XLA:GPU produced for model `name` (committed)."""
  return gzip.decompress(fixture_path(name).read_bytes()).decode()


def unavailable() -> str:
  """Why this machine cannot compile for an H200, or "" when it can."""
  try:
    import jax_plugins.xla_cuda12  # noqa: F401
  except ImportError:
    return ("the CUDA plugin is not installed (pip install jax-cuda12-plugin "
            "jax-cuda12-pjrt nvidia-cuda-nvcc-cu12 at the installed jax's version)")
  return ""


#: Compiles of a suite model in another configuration, held by the GPU rule
#: tests (not judged as a whole): name -> (model, XLA options, GPUs). With
#: Triton gemms off, XLA:GPU calls cuBLASLt (epilogues in the call); over
#: four GPUs, the batch split and the parameters replicated, the gradients
#: are all-reduced (async start/done).
VARIANTS = {
    "cublas_mlp": ("linen_mlp", {"xla_gpu_enable_triton_gemm": False}, 1),
    "dp_mlp": ("linen_mlp", {}, 4),
}


@functools.cache
def _devices(count: int = 1):
  from jax.experimental import topologies
  topo = topologies.get_topology_desc("", platform="cuda", target_config=SPEC.read_text(),
                                      topology=f"1x1x{count}")
  return tuple(topo.devices)


def _device():
  return _devices()[0]


def _abstract(a, sharding):
  import jax
  if not hasattr(a, "shape"):
    if not isinstance(a, (int, float)):
      return a  # a static argument (the example's config)
    a = jax.numpy.asarray(a)  # a Python step count
  return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)


def lower_step(fn, args, sharding):
  """`fn` lowered for arguments shaped as `args`, each placed by `sharding`.
  `fn` is a jax.jit function or an equinox filter_jit one (then args hold
  non-arrays)."""
  import jax

  def abstract(a):
    return _abstract(a, sharding)

  if hasattr(fn, "trace"):
    return fn.trace(*jax.tree.map(abstract, args)).lower()
  import equinox as eqx
  dynamic, static = eqx.partition(args, eqx.is_array)
  # The step's array outputs only (its model holds functions too).
  step = jax.jit(lambda d: eqx.filter(fn(*eqx.combine(d, static)), eqx.is_array))
  return step.trace(jax.tree.map(abstract, dynamic)).lower()


def _compile(fn, args, options=None):
  import jax
  sharding = jax.sharding.SingleDeviceSharding(_device())
  return lower_step(fn, args, sharding).compile(compiler_options=options or {})


def compile_text(fn, args, options=None) -> str:
  """`fn` compiled for one H200, as optimized HLO text (`lower_step`'s
  `fn` and `args`); `options`, XLA compiler options."""
  return _compile(fn, args, options).as_text()


def compile_with_footprint(fn, args) -> tuple[str, int]:
  """(`compile_text`'s text, XLA's own footprint of that program in bytes:
  arguments + outputs + temporaries - aliased, from `memory_analysis()`)."""
  compiled = _compile(fn, args)
  m = compiled.memory_analysis()
  footprint = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)
  return compiled.as_text(), int(footprint)


def compile_data_parallel(fn, args, gpus: int) -> str:
  """A jax.jit train step `fn(state, batch)` compiled for `gpus` H200s: the
  state replicated, the batch split over the devices."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec
  mesh = jax.sharding.Mesh(np.array(_devices(gpus)), ("data",))
  state, batch = args
  state = jax.tree.map(lambda a: _abstract(a, NamedSharding(mesh, PartitionSpec())), state)
  batch = jax.tree.map(lambda a: _abstract(a, NamedSharding(mesh, PartitionSpec("data"))),
                       batch)
  with jax.default_device(mesh.devices.flat[0]):
    return fn.trace(state, batch).lower().compile().as_text()


#: hlo-audit's built-in example (a plain-JAX transformer block's train step),
#: whose H200 compile holds XLA's Triton LayerNorm, forward and backward.
EXAMPLE = "example"


#: The example's train step with pallas_kernels swapped in (as `hlo-audit
#: swap` builds it): the kernels' launches, as XLA holds them.
SWAPPED_EXAMPLE = "swapped_example"


def program(name: str):
  """(jitted function, args) of a suite model, `EXAMPLE` or `SWAPPED_EXAMPLE`."""
  from hlo_audit._src.examples.transformer import example
  if name == EXAMPLE:
    return example()
  if name == SWAPPED_EXAMPLE:
    return swapped_example_program()
  from tests.hlo_audit.real_models import truth
  m = truth.model(name)
  return m.step() if hasattr(m, "step") else m.build()


def swapped_example_program(target: str | None = None):
  """(jitted step, args) of the CLI's swap of the example: its loss swapped,
  the step around it; planned here and built for every device, or planned
  and built for `target` alone ("h200"), as `--swap --target` does."""
  import jax

  from hlo_audit._src.cli.swap_cmd import swapped_example
  from hlo_audit._src.examples.transformer import example
  fn, (params, tokens, cfg) = example()
  _, step, _ = swapped_example(fn, cfg, target=target)
  return jax.jit(step), (params, tokens)


def write_fixture(name: str) -> pathlib.Path:
  model, options, gpus = VARIANTS.get(name, (name, None, 1))
  fn, args = program(model)
  text = compile_data_parallel(fn, args, gpus) if gpus > 1 else \
      compile_text(fn, args, options)
  path = fixture_path(name)
  path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
  return path


if __name__ == "__main__":
  reason = unavailable()
  if reason:
    sys.exit(f"h200_support: {reason}")
  for model_name in sys.argv[1:]:
    p = write_fixture(model_name)
    print(f"{p} ({p.stat().st_size} bytes)")

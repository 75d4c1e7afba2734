"""The ground-truth models compiled for a TPU v5e on a machine without one
(libtpu's compile-only topologies), and the committed HLO of those compiles
with XLA:TPU's memory statistics and libtpu's cost analysis, so the TPU truth
runs without recompiling.

`python -m tests.hlo_audit.real_models.tpu_support NAME...` rewrites the
fixtures (a model's name, one of `VARIANTS`, or `example`; needs libtpu;
run with JAX_PLATFORMS=cpu). Each fixture is `NAME.hlo.gz` (XLA:TPU's
optimized HLO) and `NAME.json`: `memory_analysis()` (argument, output,
alias and temp bytes), libtpu's `cost_analysis()` of the same compile
(`COST_KEYS`, `optimal_seconds` as reported) and the libtpu version.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent / "tpu"

#: One v5e chip; `VARIANTS` name others.
TOPOLOGY = "v5e:1x1"


def fixture_path(name: str) -> pathlib.Path:
  return HERE / f"{name}.hlo.gz"


def fixture(name: str) -> str:
  """The optimized HLO XLA:TPU produced for `name` (committed)."""
  return gzip.decompress(fixture_path(name).read_bytes()).decode()


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStats:
  """XLA:TPU's `memory_analysis()` of a compile, per chip."""

  argument: int
  output: int
  alias: int
  temp: int

  @property
  def footprint(self) -> int:
    """What the program holds in HBM at its peak: the arguments, the outputs
    that do not alias an argument, and the heap."""
    return self.argument + self.output + self.temp - self.alias


def _record(name: str) -> dict:
  return json.loads((HERE / f"{name}.json").read_text())


def stats(name: str) -> MemoryStats:
  r = _record(name)
  return MemoryStats(**{f.name: r[f.name] for f in dataclasses.fields(MemoryStats)})


#: What a fixture keeps of libtpu's `cost_analysis()`: `optimal_seconds` is
#: its step estimate (with -1 per op it cannot price, as reported).
COST_KEYS = ("optimal_seconds", "flops", "transcendentals", "bytes accessed")


def cost(name: str) -> dict[str, float]:
  """libtpu's `cost_analysis()` of the compile (`COST_KEYS`)."""
  return dict(_record(name)["cost_analysis"])


def libtpu_version(name: str) -> str:
  """The libtpu that compiled the fixture."""
  return _record(name)["libtpu"]


def fixtures() -> tuple[str, ...]:
  """Every committed fixture's name."""
  return tuple(sorted(p.name.removesuffix(".hlo.gz") for p in HERE.glob("*.hlo.gz")))


def unavailable() -> str:
  """Why this machine cannot compile for a TPU, or "" when it can."""
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return "libtpu is not installed (pip install 'jax[tpu]' at the installed jax's version)"
  return ""


#: Compiles of a suite model in another configuration: name -> (program,
#: topology). Over a 2x2 v5e slice, the batch split and the parameters
#: replicated, the gradients are all-reduced. The suite's models are small
#: enough that XLA:TPU keeps every intermediate in VMEM (a v5e has 128 MiB):
#: `ce_head_b32` (the head over 32 sequences: 256 MiB of f32 logits) and
#: `example_b32` (the example at batch 32, sequences of 512) are the sizes
#: at which it writes intermediates to HBM between kernels.
VARIANTS = {
    "dp_mlp": ("linen_mlp", "v5e:2x2"),
    "ce_head_b32": ("ce_head_b32", TOPOLOGY),
    "example_b32": ("example_b32", TOPOLOGY),
}

#: Models whose `step()` is a GPU compile's variant: the TPU compiles their
#: `build()` (dot_attention's `step()` calls cuDNN's attention, which only
#: XLA:GPU runs; `build()` is JAX's own attention).
BUILD_ON_TPU = frozenset({"dot_attention"})


@functools.cache
def _devices(topology: str = TOPOLOGY):
  from jax.experimental import topologies
  chips = 1
  for d in topology.split(":")[1].split("x"):
    chips *= int(d)
  # A single chip is no slice of its own: it needs its host bounds spelled.
  kw = {"chips_per_host_bounds": [1, 1, 1]} if chips == 1 else {}
  return tuple(topologies.get_topology_desc(topology_name=topology, platform="tpu",
                                            **kw).devices)


EXAMPLE = "example"


def program(name: str):
  """(jitted function, args) of a suite model, `EXAMPLE` or a scaled
  program of `VARIANTS`."""
  from hlo_audit._src.examples.transformer import TransformerConfig, example
  if name == EXAMPLE:
    return example()
  if name == "example_b32":
    return example(TransformerConfig(batch=32, seq=512))
  if name == "ce_head_b32":
    import jax.numpy as jnp

    from tests.hlo_audit.real_models import model_ce_head as m
    fn, (params, opt_state, _, _) = m.build()
    return fn, (params, opt_state, jnp.zeros((32, m.SEQ, m.DIM), jnp.float32),
                jnp.zeros((32, m.SEQ), jnp.int32))
  from tests.hlo_audit.real_models import truth
  m = truth.model(name)
  return m.step() if hasattr(m, "step") and name not in BUILD_ON_TPU else m.build()


def _stats_of(compiled) -> MemoryStats:
  m = compiled.memory_analysis()
  return MemoryStats(argument=m.argument_size_in_bytes, output=m.output_size_in_bytes,
                     alias=m.alias_size_in_bytes, temp=m.temp_size_in_bytes)


def _cost_of(compiled) -> dict[str, float]:
  c = compiled.cost_analysis()
  if isinstance(c, (list, tuple)):  # older JAX: one dict per device
    c = c[0]
  return {k: float(c[k]) for k in COST_KEYS if k in c}


def topology(name: str) -> str:
  """The slice `name` is compiled for ("v5e:1x1" unless `VARIANTS` says)."""
  return VARIANTS.get(name, (name, TOPOLOGY))[1]


def compile_one(name: str):
  """`name` compiled for its TPU topology: (optimized HLO, memory stats,
  libtpu's cost analysis)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec

  from tests.hlo_audit.real_models import h200_support
  fn, args = program(VARIANTS.get(name, (name, TOPOLOGY))[0])
  devices = _devices(topology(name))
  if len(devices) == 1:
    compiled = h200_support.lower_step(
        fn, args, jax.sharding.SingleDeviceSharding(devices[0])).compile()
  else:
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    state, batch = args
    place = h200_support._abstract  # noqa: SLF001 - the same placement as the H200's
    state = jax.tree.map(lambda a: place(a, NamedSharding(mesh, PartitionSpec())), state)
    batch = jax.tree.map(lambda a: place(a, NamedSharding(mesh, PartitionSpec("data"))),
                         batch)
    compiled = fn.trace(state, batch).lower().compile()
  return compiled.as_text(), _stats_of(compiled), _cost_of(compiled)


def write_fixture(name: str) -> pathlib.Path:
  from hlo_audit._src.target import wheels
  text, mem, cost_analysis = compile_one(name)
  path = fixture_path(name)
  path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
  record = {**dataclasses.asdict(mem), "cost_analysis": cost_analysis,
            "libtpu": wheels.libtpu_version() or ""}
  (HERE / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
  return path


if __name__ == "__main__":
  reason = unavailable()
  if reason:
    sys.exit(f"tpu_support: {reason}")
  for model_name in sys.argv[1:]:
    p = write_fixture(model_name)
    print(f"{p} ({p.stat().st_size} bytes)", flush=True)

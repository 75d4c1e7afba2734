"""TPU generations: what a TPU target names, and each chip's facts with
their sources.

libtpu compiles for a TPU this machine does not have through a compile-only
topology (`jax.experimental.topologies.get_topology_desc(topology_name=
"v5e:2x2", platform="tpu")`); this module alone knows the generations it
can name and what a chip of each does per second. A target name is a
generation ("v5e": one chip) or a topology as libtpu takes it ("v5e:2x2",
"v5p:2x2x1": chips along each axis).

The peaks are Google's (Cloud TPU system architecture pages, per chip). The
rates libtpu's own cost model prices with were read by compiling probe
kernels and dividing their `cost_analysis()` by its `optimal_seconds`
(libtpu 0.0.42.1): a large bf16 matmul runs at the published bf16 peak on
v5e and v6e (v4 and v5p: 137 and 394 TFLOP/s per device), a streaming
kernel at `hbm_fraction` of HBM bandwidth, a chain of 200 FMAs per element
still at HBM speed (libtpu bounds no elementwise arithmetic), and exp at
the transcendental rates below.
"""

from __future__ import annotations

import dataclasses
import re
import types

from hlo_audit._src.errors import TargetError
from hlo_audit._src.target.devices import NOT_CHECKED, DeviceFacts

_DOCS = "https://cloud.google.com/tpu/docs/"
GiB = 1 << 30


@dataclasses.dataclass(frozen=True, slots=True)
class TpuGeneration:
  """One TPU generation: per-chip facts and how libtpu names it."""

  #: Our name and libtpu's topology prefix: "v5e".
  name: str
  #: What jax calls its devices (`device_kind`): "TPU v5 lite".
  device_kind: str
  #: Axes of a topology name: 2 ("v5e:2x2") or 3 ("v5p:2x2x1").
  topology_axes: int
  #: TensorCores per chip.
  cores_per_chip: int
  #: Devices per chip in libtpu's compile-only topologies: one per core
  #: (v4's), or one megacore of all (v5p's).
  devices_per_chip: int
  #: HBM per chip, bytes.
  hbm_bytes: int
  #: HBM bandwidth per chip, bytes/s.
  hbm_bandwidth: float
  #: Dense bf16 FLOP/s of the matrix units (MXUs), per chip.
  bf16_flops: float
  #: Dense int8 OP/s, per chip.
  int8_ops: float
  #: Inter-chip interconnect bytes/s per chip, both directions together;
  #: 0 where Google publishes none.
  ici_bandwidth: float
  #: exp/log/... results per second per chip, libtpu's rate (see above).
  transcendentals_per_second: float
  #: Google's page the peaks come from.
  source: str
  #: The fraction of `hbm_bandwidth` a kernel streams at, libtpu's
  #: (`HBM_FRACTION_SOURCE`).
  hbm_fraction: float
  #: HBM bytes of a tuple's pointer table in XLA:TPU's heap: this many
  #: whatever the elements (0: 8 per element, rounded up to 32 bytes).
  #: Measured in libtpu's buffer-assignment dumps (0.0.42.1 and 0.0.50.1):
  #: 512 on v4 and v5e up to the 106 elements seen; 8 x elements rounded to
  #: 32 on v5p and v6e.
  tuple_table_fixed: int = 0

  def tuple_table_bytes(self, elements: int) -> int:
    """HBM bytes of the pointer table of a tuple of `elements` elements."""
    if self.tuple_table_fixed:
      return self.tuple_table_fixed
    return -(-8 * elements // 32) * 32

  @property
  def one_chip(self) -> str:
    """The topology of one chip: "v5e:1x1", "v5p:1x1x1"."""
    return f"{self.name}:" + "x".join(["1"] * self.topology_axes)


#: The generations a target can name. Peaks: Google's pages (`source`);
#: transcendental rates: libtpu's cost model (module docstring), per chip.
GENERATIONS: tuple[TpuGeneration, ...] = (
    TpuGeneration("v4", "TPU v4", 3, 2, 2, 32 * GiB, 1200e9, 275e12, 275e12, 0.0,
                  2 * 5.38e11, _DOCS + "v4", hbm_fraction=0.8187, tuple_table_fixed=512),
    TpuGeneration("v5e", "TPU v5 lite", 2, 1, 1, 16 * GiB, 819e9, 197e12, 394e12, 400e9,
                  1.54e12, _DOCS + "v5e", hbm_fraction=0.9007, tuple_table_fixed=512),
    TpuGeneration("v5p", "TPU v5", 3, 2, 1, 95 * GiB, 2765e9, 459e12, 918e12, 1200e9,
                  3.07e12, _DOCS + "v5p-training", hbm_fraction=0.8501),
    TpuGeneration("v6e", "TPU v6 lite", 2, 1, 1, 32 * GiB, 1638e9, 918e12, 1836e12, 800e9,
                  1.79e12, _DOCS + "v6e", hbm_fraction=1.0),
)
HBM_FRACTION_SOURCE = (
    "libtpu's cost model, 0.0.42.1 and 0.0.50.1 alike, probed 2026-12-06 on one chip of "
    "each generation: x * 2, x + y and row and column sums of f32 and bf16 arrays of "
    "16-512 MiB price at their bytes accessed over this fraction of Google's HBM "
    "bandwidth, the same to four digits in every probe (v4 0.8187, v5e 0.9007, v5p "
    "0.8501, v6e 1.0000)")
_BY_NAME = {g.name: g for g in GENERATIONS}

#: (sublanes, lanes): XLA:TPU's gathers and scatters move each index's row
#: in whole blocks of 8 x 128 elements, one index after another.
INDEX_BLOCK = (8, 128)
INDEX_BLOCK_SOURCE = (
    "libtpu 0.0.42.1's cost model, probed 2026-12-06 on v5e:1x1 (compiled scatters and "
    "gathers of 1-162000 indices into f32, s32 and bf16 operands of 121-162000 rows): "
    "each update costs a read and a write of 8 x 128 elements of the operand's type "
    "(f32: 12.5 ns, 9.2 KB; bf16: half), each gathered index one read (7 ns), whatever "
    "the operand's size or row width up to 128; a row of 256 or 1024 costs 2 or 8 "
    "such blocks; a scatter into a fill its own kernel makes costs its bytes alone")
#: Other spellings people and libtpu use.
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e",
           "v5": "v5p", "v4p": "v4"}

_TOPOLOGY = re.compile(r"^([a-z0-9]+)(?::(\d+(?:x\d+)*))?$")


@dataclasses.dataclass(frozen=True, slots=True)
class TpuTopology:
  """A generation and a slice of it, as a target names them."""

  generation: TpuGeneration
  #: Chips along each axis.
  dims: tuple[int, ...]

  @property
  def name(self) -> str:
    """libtpu's topology name: "v5e:2x2"."""
    return f"{self.generation.name}:" + "x".join(map(str, self.dims))

  @property
  def chips(self) -> int:
    n = 1
    for d in self.dims:
      n *= d
    return n

  @property
  def device_count(self) -> int:
    return self.chips * self.generation.devices_per_chip


def is_tpu_name(name: str) -> bool:
  """Whether `name` names a TPU generation or topology (without checking it)."""
  m = _TOPOLOGY.match(name.strip().lower())
  return bool(m) and _generation_name(m.group(1)) in _BY_NAME


def _generation_name(text: str) -> str:
  return ALIASES.get(text, text)


def parse_topology(name: str) -> TpuTopology:
  """"v5e" (one chip), "v5e:2x2", "v5p:2x2x1" -> a `TpuTopology`.

  Raises:
    TargetError: for a name that is no TPU generation, or axes that do not
      fit it (a v5e slice has two, a v4 or v5p slice three).
  """
  text = name.strip().lower()
  m = _TOPOLOGY.match(text)
  gen = _BY_NAME.get(_generation_name(m.group(1))) if m else None
  if gen is None:
    raise TargetError(f"unknown TPU {name!r}: expected one of "
                      + ", ".join(g.name for g in GENERATIONS)
                      + ", alone (one chip) or with a topology, e.g. 'v5e:2x2', 'v5p:2x2x1'")
  if m.group(2) is None:
    return TpuTopology(gen, (1,) * gen.topology_axes)
  dims = tuple(int(d) for d in m.group(2).split("x"))
  if len(dims) != gen.topology_axes or any(d < 1 for d in dims):
    example = "x".join(["2"] * 2 + ["1"] * (gen.topology_axes - 2))
    raise TargetError(f"TPU topology {name!r}: a {gen.name} slice has "
                      f"{gen.topology_axes} axes of chips, e.g. '{gen.name}:{example}'")
  return TpuTopology(gen, dims)


def generation_of(device_kind: str) -> TpuGeneration | None:
  """The generation whose devices jax calls `device_kind`."""
  for g in GENERATIONS:
    if g.device_kind == device_kind:
      return g
  return None


def tuple_table_bytes(device: str, elements: int) -> int:
  """HBM bytes of a tuple's pointer table on `device` (a generation or
  topology name, or what jax calls its devices); a v5e's where the device
  is unknown or no TPU (HLO text names no generation)."""
  gen = generation_of(device)
  if gen is None and is_tpu_name(device):
    gen = parse_topology(device).generation
  return (gen or _BY_NAME["v5e"]).tuple_table_bytes(elements)


def tpu_facts(gen: TpuGeneration) -> DeviceFacts:
  """One device's facts: a chip's, or its share where libtpu makes each
  TensorCore a device (v4)."""
  cores = gen.cores_per_chip // gen.devices_per_chip
  share = 1 / gen.devices_per_chip
  per = "" if share == 1 else f", x {cores}/{gen.cores_per_chip} TensorCores per device"
  doc = f"Google's {gen.name} page ({gen.source})"
  sources = {
      "memory_bandwidth": (f"{doc}: HBM bandwidth per chip{per}, x {gen.hbm_fraction} "
                           f"that a kernel streams at: {HBM_FRACTION_SOURCE}"),
      "matrix_flops": f"{doc}: peak bf16 and int8 per chip{per}",
      "vector_flops": ("none: libtpu's cost model bounds no elementwise arithmetic "
                       "(200 FMAs per element price at HBM speed), nor does this one"),
      "transcendentals_per_second": (f"libtpu's cost model: exp results per second of a "
                                     f"transcendental-bound probe kernel{per}"),
      "launch_overhead": ("none: libtpu's cost model adds no fixed cost per kernel (an "
                          "8 KiB kernel prices at its bytes over HBM bandwidth)"),
      "on_chip_bandwidth": ("the streamed HBM rate, as libtpu's cost analysis prices the "
                            "bytes of operands XLA placed in VMEM; Google publishes no "
                            "VMEM bandwidth"),
  }
  sources["index_block"] = INDEX_BLOCK_SOURCE
  link = gen.ici_bandwidth / 2 * share
  if link:
    sources["link_bandwidth"] = f"{doc}: bidirectional ICI bandwidth per chip, one direction{per}"
  else:
    sources["link_bandwidth"] = f"{doc} gives no ICI bandwidth: collectives priced by latency only"
  bf16 = gen.bf16_flops * share
  # Streams, VMEM operands and index blocks alike move at libtpu's rate.
  streamed = gen.hbm_bandwidth * gen.hbm_fraction * share
  return DeviceFacts(
      name=gen.name, description=gen.device_kind, platform="tpu",
      memory_bandwidth=streamed,
      matrix_flops=types.MappingProxyType({"bf16": bf16, "f32": bf16, "f16": bf16,
                                           "s8": gen.int8_ops * share,
                                           "u8": gen.int8_ops * share}),
      transcendentals_per_second=gen.transcendentals_per_second * share,
      link_bandwidth=link, on_chip_bandwidth=streamed,
      index_block=INDEX_BLOCK,
      sources=types.MappingProxyType(sources), checked=NOT_CHECKED)

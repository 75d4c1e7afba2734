"""Device facts: what one device can do per second, each fact with its source.

The time model (analysis/time_model.py) prices every kernel with these and
nothing else: no other module keeps a bandwidth, a peak or a launch cost.

- A GPU's facts come from XLA's own spec of it (`specs.py`): HBM bandwidth,
  L2 size, SM count and clocks, and the per-type rates of its matrix (tensor
  core) and scalar units; the few facts XLA's spec lacks (launch overhead,
  NVLink per link, the special-function unit's rate) come from the table
  below, each with its source.
- This machine's CPU is measured (`calibration.py`): a short benchmark run
  once per machine and jax version, cached, re-run by `hlo-audit calibrate`.

Nothing here was checked against a kernel timed on a GPU unless
`DeviceFacts.checked` says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Mapping

from hlo_audit._src.errors import TargetError
from hlo_audit._src.hlo import dtypes

#: What a GPU estimate says until a profile on the device confirms it.
NOT_CHECKED = "not yet checked against kernels timed on the device"


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceFacts:
  """What one device does per second: the time model's only inputs besides
  the program. Rates are per device; times in seconds, sizes in bytes."""

  #: Our name: "h200", "cpu".
  name: str
  #: In words, e.g. "NVIDIA H200 141GB HBM3e" or "Intel(R) Xeon(R), 2 cores".
  description: str
  #: "gpu", "cpu" or "tpu".
  platform: str
  #: Main memory (HBM, DRAM) bandwidth, bytes/s: a kernel's working set
  #: beyond every cache streams at this rate.
  memory_bandwidth: float
  #: (working set up to this many bytes, bytes/s), smallest first: kernels
  #: whose reads and writes fit are priced at the faster rate.
  cache_bandwidths: tuple[tuple[int, float], ...] = ()
  #: Element type -> dense FLOP/s of the matrix unit (tensor cores; the CPU's
  #: measured matmul rate). Types missing here use `vector_flops`.
  matrix_flops: Mapping[str, float] = dataclasses.field(default_factory=dict)
  #: How fast each of the backend's dot implementations runs, relative to
  #: `matrix_flops` (its library's dot of untransposed operands): "nt" the
  #: library's dot whose right operand is transposed, "plain" a dot the
  #: backend emits itself (XLA:CPU's Eigen dots); missing: as fast.
  matrix_variants: Mapping[str, float] = dataclasses.field(default_factory=dict)
  #: Variant ("" the library's) -> (contracted size, efficiency) points,
  #: ascending: a dot or convolution summing fewer elements per output runs
  #: at that fraction of its rate (interpolated in log size; beyond the last
  #: point, the full rate).
  narrow_contraction: Mapping[str, tuple[tuple[int, float], ...]] = dataclasses.field(
      default_factory=dict)
  #: Reduced elements per second a library's reduction kernel reads
  #: (YNNPACK's on XLA:CPU); 0: its bytes and the vector rate price it.
  reduction_rate: float = 0.0
  #: Element type -> elementwise FLOP/s (an FMA counts two); "f32" stands
  #: for types without an entry.
  vector_flops: Mapping[str, float] = dataclasses.field(default_factory=dict)
  #: Transcendental results per second (exp, log, tanh, ...).
  transcendentals_per_second: float = 0.0
  #: Seconds each kernel launch costs beyond its work.
  launch_overhead: float = 0.0
  #: Bytes per second one device sends to its peers (and receives) in a
  #: collective; 0: the device has no link modeled.
  link_bandwidth: float = 0.0
  #: Seconds each collective costs beyond its bytes.
  collective_latency: float = 0.0
  #: Seconds a kernel the backend splits over threads adds (XLA:CPU's
  #: `outer_dimension_partitions`: a fork and a join per launch).
  parallel_overhead: float = 0.0
  #: Bytes/s of a kernel that reads or writes out of order (a transpose of
  #: the minor dimension, an interleaved reduction); 0: no slower than
  #: streaming (XLA:GPU tiles transposes through shared memory).
  strided_bandwidth: float = 0.0
  #: Input elements per second a loop-emitted reduction reads (XLA:CPU's
  #: loop emitter reduces one element at a time); 0: the vector rate.
  loop_reduction_rate: float = 0.0
  #: A CUDA GPU's compute capability, e.g. "9.0" (which fused calls and
  #: kernels it can run); "" for other devices.
  compute_capability: str = ""
  #: Bytes/s of kernels' reads and writes of buffers XLA keeps on chip (a
  #: TPU's VMEM, memory space 1); 0: free.
  on_chip_bandwidth: float = 0.0
  #: (sublanes, lanes) of the block a gather or scatter moves per index, one
  #: index after another, at `memory_bandwidth` (a TPU's: every index reads,
  #: a scatter's reads and writes, each (8, 128) block its window touches);
  #: (): indices cost only the bytes they move.
  index_block: tuple[int, ...] = ()
  #: Fact name -> where it comes from.
  sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  #: Whether the facts were measured on this machine (the CPU's).
  measured: bool = False
  #: How the estimates were checked against a device's measured kernel times,
  #: or `NOT_CHECKED`.
  checked: str = NOT_CHECKED

  def matrix_rate(self, element_type: str, variant: str = "") -> float:
    """FLOP/s of a dot or convolution whose operands are `element_type`
    (`variant`: which implementation runs it, `matrix_variants`)."""
    rate = self.matrix_flops.get(element_type)
    if not rate:
      return self.vector_rate(element_type)
    return rate * self.matrix_variants.get(variant, 1.0)

  def contraction_efficiency(self, contracted: int, variant: str = "") -> float:
    """The fraction of its rate a dot summing `contracted` elements per
    output reaches (`narrow_contraction`; 1.0 without points)."""
    points = self.narrow_contraction.get(variant) or self.narrow_contraction.get("", ())
    if not points or contracted <= 0 or contracted >= points[-1][0]:
      return 1.0
    if len(points) == 1:
      return points[0][1]
    (k0, e0), (k1, e1) = points[0], points[1]
    for (k0, e0), (k1, e1) in zip(points, points[1:]):
      if contracted <= k1:
        break
    slope = (math.log(e1) - math.log(e0)) / (math.log(k1) - math.log(k0))
    return min(1.0, math.exp(math.log(e0) + slope * (math.log(contracted) - math.log(k0))))

  def vector_rate(self, element_type: str) -> float:
    """FLOP/s of elementwise arithmetic in `element_type`."""
    rate = self.vector_flops.get(element_type) or self.vector_flops.get("f32")
    return rate or 0.0

  def indexed_bytes(self, access) -> int:
    """Bytes one `work.IndexedAccess` moves in `index_block`s (0 without
    them): whole blocks per index, read, and written back by a scatter."""
    if not self.index_block:
      return 0
    sublanes, lanes = self.index_block
    blocks = -(-access.minor // lanes) * -(-access.second_minor // sublanes) * access.rest
    return (access.indices * blocks * sublanes * lanes * access.element_bytes
            * (2 if access.writes else 1))

  def bandwidth(self, working_set: int) -> float:
    """Bytes/s for a kernel moving `working_set` bytes: the first cache level
    that holds it, else main memory."""
    for size, rate in self.cache_bandwidths:
      if working_set <= size:
        return rate
    return self.memory_bandwidth

  def to_dict(self) -> dict:
    return {"name": self.name, "description": self.description,
            "platform": self.platform, "memory_bandwidth": self.memory_bandwidth,
            "cache_bandwidths": [list(c) for c in self.cache_bandwidths],
            "matrix_flops": dict(self.matrix_flops),
            "matrix_variants": dict(self.matrix_variants),
            "narrow_contraction": {v: [list(p) for p in points]
                                   for v, points in self.narrow_contraction.items()},
            "reduction_rate": self.reduction_rate,
            "vector_flops": dict(self.vector_flops),
            "transcendentals_per_second": self.transcendentals_per_second,
            "launch_overhead": self.launch_overhead,
            "link_bandwidth": self.link_bandwidth,
            "collective_latency": self.collective_latency,
            "parallel_overhead": self.parallel_overhead,
            "strided_bandwidth": self.strided_bandwidth,
            "loop_reduction_rate": self.loop_reduction_rate,
            "compute_capability": self.compute_capability,
            "on_chip_bandwidth": self.on_chip_bandwidth,
            "index_block": list(self.index_block),
            "sources": dict(self.sources), "measured": self.measured,
            "checked": self.checked}

  @classmethod
  def from_dict(cls, d: Mapping) -> DeviceFacts:
    """The inverse of `to_dict` (a report read from JSON, a cached calibration).

    Raises:
      TargetError: for a document that lacks a fact or has one of a wrong type.
    """
    try:
      return cls(
          name=str(d["name"]), description=str(d["description"]),
          platform=str(d["platform"]), memory_bandwidth=float(d["memory_bandwidth"]),
          cache_bandwidths=tuple((int(s), float(r)) for s, r in d.get("cache_bandwidths", ())),
          matrix_flops=types.MappingProxyType(
              {str(k): float(v) for k, v in d.get("matrix_flops", {}).items()}),
          matrix_variants=types.MappingProxyType(
              {str(k): float(v) for k, v in d.get("matrix_variants", {}).items()}),
          narrow_contraction=types.MappingProxyType(
              {str(v): tuple((int(k), float(e)) for k, e in points)
               for v, points in d.get("narrow_contraction", {}).items()}),
          reduction_rate=float(d.get("reduction_rate", 0.0)),
          compute_capability=str(d.get("compute_capability", "")),
          on_chip_bandwidth=float(d.get("on_chip_bandwidth", 0.0)),
          index_block=tuple(int(x) for x in d.get("index_block", ())),
          vector_flops=types.MappingProxyType(
              {str(k): float(v) for k, v in d.get("vector_flops", {}).items()}),
          transcendentals_per_second=float(d.get("transcendentals_per_second", 0.0)),
          launch_overhead=float(d.get("launch_overhead", 0.0)),
          link_bandwidth=float(d.get("link_bandwidth", 0.0)),
          collective_latency=float(d.get("collective_latency", 0.0)),
          parallel_overhead=float(d.get("parallel_overhead", 0.0)),
          strided_bandwidth=float(d.get("strided_bandwidth", 0.0)),
          loop_reduction_rate=float(d.get("loop_reduction_rate", 0.0)),
          sources=types.MappingProxyType({str(k): str(v)
                                          for k, v in d.get("sources", {}).items()}),
          measured=bool(d.get("measured", False)), checked=str(d.get("checked", NOT_CHECKED)))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise TargetError(f"device facts: missing or malformed field ({e})") from None


# ------------------------------------------------------------------ GPUs ----

#: XLA:GPU's own estimate of a kernel launch (GpuPerformanceModelBase::
#: kKernelLaunchOverhead, xla/service/gpu/model/gpu_performance_model_base.h).
GPU_LAUNCH_OVERHEAD = 1e-6
#: XLA:GPU's estimate of a NCCL collective's fixed cost (kNcclKernelLaunchOverhead).
GPU_COLLECTIVE_LATENCY = 5e-6
#: XLA:GPU reads data that fits in L2 this many times faster than from HBM
#: (GpuPerformanceModelBase::kL2CacheSpeedup).
GPU_L2_SPEEDUP = 2.5
#: NVLink bytes/s per link in each direction, by compute capability major
#: (NVIDIA's NVLink generations: 3rd (A100) and 4th (H100/H200) 25 GB/s, 5th
#: (B200) 50 GB/s; e.g. H100 SXM: 18 links, 900 GB/s both directions).
NVLINK_PER_LINK = {8: 25e9, 9: 25e9, 10: 50e9, 11: 50e9, 12: 50e9}
#: Special-function unit results per SM per clock (exp2, log2, rsqrt, sin,
#: cos): NVIDIA's CUDA C++ Programming Guide, "Arithmetic Instructions",
#: 16 for compute capability 5.x through 9.0.
SFU_PER_SM_PER_CLOCK = 16

_RATE = re.compile(
    r"rate_infos\s*\{\s*key:\s*(\d+)\s*value\s*\{([^}]*)\}\s*\}")


def _number(text: str, field: str) -> float:
  m = re.search(rf"\b{field}:\s*([0-9.eE+-]+)", text)
  return float(m.group(1)) if m else 0.0


def _block(text: str, name: str) -> tuple[int, int]:
  """[start, end) of the `name { ... }` block of a text proto; (0, 0) when
  there is none."""
  start = text.find(name + " {")
  if start < 0:
    return 0, 0
  depth = 0
  for i in range(text.index("{", start), len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return start, i + 1
  return start, len(text)


_UNITS = ("matrix_unit_description", "scalar_unit_description")


def _unit_rates(text: str, unit: str, cores: float) -> dict[str, float]:
  """Element type -> FLOP/s of one of the spec's unit descriptions (`_UNITS`):
  each rate entry is operations (FMAs) per clock per unit; an FMA is two
  FLOPs."""
  start, end = _block(text, unit)
  out: dict[str, float] = {}
  for m in _RATE.finditer(text, start, end):
    name = dtypes.PRIMITIVE_TYPES.get(int(m.group(1)))
    if name is None:
      continue  # a type newer than our table
    body = m.group(2)
    out[name] = (2 * cores * _number(body, "units_per_core") * _number(body, "ops_per_clock")
                 * _number(body, "clock_rate_ghz") * 1e9)
  return out


def _device_fields(text: str) -> str:
  """The spec without its unit descriptions, whose rate entries have fields
  of the device's names (`clock_rate_ghz`)."""
  for unit in _UNITS:
    start, end = _block(text, unit)
    text = text[:start] + text[end:]
  return text


def gpu_facts(spec) -> DeviceFacts:
  """A GPU's facts from its XLA spec (a `specs.GpuSpec`)."""
  text = spec.text
  device = _device_fields(text)
  source = f"XLA's spec ({spec.source})"
  cores = float(spec.core_count or _number(device, "core_count"))
  clock = _number(device, "clock_rate_ghz") * 1e9
  hbm = _number(device, "memory_bandwidth")
  l2 = int(_number(device, "l2_cache_size"))
  matrix = _unit_rates(text, "matrix_unit_description", cores)
  vector = _unit_rates(text, "scalar_unit_description", cores)
  sources = {"memory_bandwidth": f"{source}: memory_bandwidth",
             "cache_bandwidths": (f"{source}: l2_cache_size, at {GPU_L2_SPEEDUP}x HBM "
                                  "(XLA:GPU's kL2CacheSpeedup)"),
             "launch_overhead": "XLA:GPU's kKernelLaunchOverhead (1 us)",
             "collective_latency": "XLA:GPU's kNcclKernelLaunchOverhead (5 us)"}
  if matrix:
    sources["matrix_flops"] = (f"{source}: matrix_unit_description (units x ops per "
                               "clock x clock x SMs, an FMA two FLOPs)")
  else:
    sources["matrix_flops"] = f"{source} gives no matrix unit rates: the vector rate"
  if not vector:
    # Older specs: fpus_per_core FMAs per clock, in f32.
    fpus = _number(device, "fpus_per_core")
    if fpus and clock:
      vector = {"f32": 2 * cores * fpus * clock}
    sources["vector_flops"] = f"{source}: fpus_per_core x clock x SMs"
  else:
    sources["vector_flops"] = f"{source}: scalar_unit_description"
  cc = spec.compute_capability
  major = int(cc.split(".")[0]) if cc else 0
  links = int(_number(device, "active_links"))
  per_link = NVLINK_PER_LINK.get(major, 0.0)
  if links and per_link:
    link = links * per_link
    sources["link_bandwidth"] = (f"{source}: {links} active NVLink links x "
                                 f"{per_link / 1e9:g} GB/s each way (NVIDIA's NVLink "
                                 "generations)")
  else:
    link = _number(device, "pcie_bandwidth")
    sources["link_bandwidth"] = f"{source}: pcie_bandwidth (no NVLink in the spec)"
  sfu = cores * SFU_PER_SM_PER_CLOCK * clock
  sources["transcendentals_per_second"] = (
      f"{SFU_PER_SM_PER_CLOCK} special-function results per SM per clock (CUDA C++ "
      f"Programming Guide) x SMs x {source}: clock_rate_ghz")
  return DeviceFacts(
      name=spec.name, description=spec.device_kind or spec.name, platform="gpu",
      memory_bandwidth=hbm,
      cache_bandwidths=((l2, GPU_L2_SPEEDUP * hbm),) if l2 else (),
      matrix_flops=types.MappingProxyType(matrix),
      vector_flops=types.MappingProxyType(vector),
      transcendentals_per_second=sfu, launch_overhead=GPU_LAUNCH_OVERHEAD,
      link_bandwidth=link, collective_latency=GPU_COLLECTIVE_LATENCY,
      compute_capability=cc, sources=types.MappingProxyType(sources))

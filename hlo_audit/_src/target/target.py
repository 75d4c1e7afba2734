"""A target: the device XLA compiles for, which this machine need not have.

`get_target("h200")` names one GPU by its spec (`specs.py`);
`get_target("h200", gpus=8)` a topology of eight with a mesh over them. The
compile goes through a compile-only PJRT topology built from the spec
(`jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=spec)`): XLA:GPU's own passes run on this CPU and produce the
optimized HLO, the memory analysis and the cost analysis the GPU would get,
but nothing runs, so nothing is autotuned (`Target.notes` says what that
changes; `autotune_results` loads results dumped on a real GPU).

`get_target("v5e")` names one TPU chip, `get_target("v5e:2x2")` a slice
(`tpus.py`): libtpu compiles for `get_topology_desc(topology_name="v5e:2x2",
platform="tpu")` on this CPU the same way, XLA:TPU's passes and cost model
included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from hlo_audit._src.errors import TargetError
from hlo_audit._src.target import calibration, devices, tpus
from hlo_audit._src.target import specs as specs_mod
from hlo_audit._src.target import wheels
from hlo_audit._src.target.devices import DeviceFacts
from hlo_audit._src.target.specs import GpuSpec

#: What a compile without the GPU leaves out, for the report's header.
NOT_AUTOTUNED = ("not autotuned: gemm tile sizes and the Triton-or-cuBLAS choice "
                 "are XLA's defaults (--autotune-results FILE loads a real GPU's); "
                 "what fuses with what is decided before autotuning")


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
  """A device, or a topology of them, to compile for.

  Build one with `get_target`; `audit`, `capture`, the `testing` assertions
  and sweeps take it (or just its name) as `target=`.
  """

  #: Our name of the device, e.g. "h200", "v5e", or the spec file's path.
  name: str
  #: The PJRT platform compiled for: "cuda" or "tpu".
  platform: str
  #: What the devices call themselves (jax's `device_kind`), e.g.
  #: "NVIDIA H200 141GB HBM3e".
  device_kind: str
  #: Devices in the topology; more than one makes a mesh (`mesh`).
  device_count: int = 1
  #: The GPU's spec (the `GpuTargetConfigProto` and where it came from).
  spec: GpuSpec | None = dataclasses.field(default=None, compare=False)
  #: XLA autotune results dumped on a real GPU
  #: (`--xla_gpu_dump_autotune_results_to=FILE`), loaded into the compile;
  #: None: not autotuned.
  autotune_results: str | None = None
  #: A TPU target's generation and slice.
  tpu: tpus.TpuTopology | None = None

  @property
  def label(self) -> str:
    """"h200", "8x h200" for a topology of eight, "v5e" or "v5e:2x2"."""
    if self.tpu is not None:
      return self.name
    return self.name if self.device_count == 1 else f"{self.device_count}x {self.name}"

  @property
  def autotuned(self) -> bool:
    return self.autotune_results is not None

  def notes(self) -> tuple[str, ...]:
    """How this compile differs from one on the device itself."""
    if self.tpu is not None:
      version = wheels.libtpu_version()
      return (f"XLA:TPU of libtpu{' ' + version if version else ''}: nothing ran, so no "
              "time here was measured",)
    out = []
    if self.autotune_results is None:
      out.append(NOT_AUTOTUNED)
    else:
      out.append(f"autotuned from {self.autotune_results} (results dumped on a real GPU)")
    if self.spec is not None:
      out.append(f"spec: {self.spec.source}")
    return tuple(out)

  def describe(self) -> str:
    """One line: the device, how many, the compute capability."""
    if self.tpu is not None:
      chips = self.tpu.chips
      count = f"{chips} chip{'s' if chips > 1 else ''}"
      if self.device_count != chips:
        count += f" ({self.device_count} devices, one per TensorCore)"
      return f"{self.label}: {self.device_kind}, {count}, compiled without one"
    kind = self.device_kind + (f" (sm_{self.spec.compute_capability})"
                               if self.spec is not None and self.spec.compute_capability
                               else "")
    count = f"{self.device_count} GPUs" if self.device_count > 1 else "1 GPU"
    return f"{self.label}: {kind}, {count}, compiled without one"

  # ------------------------------------------------------ jax objects ----

  def devices(self) -> tuple[Any, ...]:
    """The topology's devices (compile-only: nothing runs on them)."""
    return _topology(self).devices

  def mesh(self, shape: Sequence[int] | None = None,
           axis_names: Sequence[str] = ("data",)):
    """A mesh over the devices (default: one axis, 'data', over all), with
    auto axes: XLA's sharding propagation places what is not annotated.

    Raises:
      TargetError: when the shape does not cover the devices.
    """
    import jax
    import numpy as np

    shape = tuple(shape) if shape is not None else (self.device_count,)
    if int(np.prod(shape)) != self.device_count or len(shape) != len(axis_names):
      raise TargetError(f"mesh {shape} with axes {tuple(axis_names)} does not cover "
                        f"the {self.device_count} devices of target {self.label}")
    grid = np.array(self.devices(), dtype=object).reshape(shape)
    auto = getattr(jax.sharding, "AxisType", None)
    kw = {"axis_types": (auto.Auto,) * len(shape)} if auto is not None else {}
    return jax.sharding.Mesh(grid, tuple(axis_names), **kw)

  def compiler_options(self) -> dict[str, str]:
    """Per-compile XLA options the target asks for."""
    if self.autotune_results is None:
      return {}
    return {"xla_gpu_load_autotune_results_from": self.autotune_results}

  def place(self, args: Any, kwargs: Any | None = None) -> tuple[Any, Any]:
    """`args` and `kwargs` with the target's shardings, for `jit.lower`.

    One device: an argument placed on another device (a committed array, a
    `ShapeDtypeStruct` with a sharding) becomes a `ShapeDtypeStruct` on the
    target; uncommitted arrays and plain `ShapeDtypeStruct`s are left as
    they are (`lowering` makes the target the default device, so
    `eqx.filter_jit`, which traces arrays only, still sees arrays).
    Several: every array leaf becomes a `ShapeDtypeStruct` on the target's
    mesh, keeping a `NamedSharding`'s partition spec when its mesh has as
    many devices (its axes move to the target's devices), replicated
    otherwise. Leaves that are not arrays (static configs, Python scalars)
    pass unchanged.
    """
    import jax
    import numpy as np

    kwargs = {} if kwargs is None else kwargs
    devices = self.devices()
    if self.device_count == 1:
      single = jax.sharding.SingleDeviceSharding(devices[0])

      def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
          if x.sharding is None or _on(x.sharding, devices):
            return x
          return _struct(x, single)
        if isinstance(x, jax.Array) and getattr(x, "committed", True) and \
            not _on(x.sharding, devices):
          return _struct(x, single)
        return x
    else:
      mesh = self.mesh()
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

      def moved(sharding):
        if sharding is not None and _on(sharding, devices):
          return sharding
        smesh = getattr(sharding, "mesh", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and smesh is not None and \
            int(np.prod(tuple(smesh.shape.values()))) == self.device_count:
          sizes = tuple(smesh.shape.values())
          target_mesh = self.mesh(sizes, tuple(smesh.axis_names))
          return jax.sharding.NamedSharding(target_mesh, sharding.spec)
        return replicated

      def leaf(x):
        if isinstance(x, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)):
          return _struct(x, moved(getattr(x, "sharding", None)))
        return x

    return jax.tree.map(leaf, args), jax.tree.map(leaf, kwargs)

  @contextlib.contextmanager
  def lowering(self) -> Iterator[None]:
    """Where `jit.lower` runs for this target: its first device is the
    default device (uncommitted arguments land there)."""
    import jax

    with jax.default_device(self.devices()[0]):
      yield


def _struct(x, sharding):
  import jax

  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding,
                              weak_type=bool(getattr(x, "weak_type", False)))


def _on(sharding, devices) -> bool:
  """Whether a sharding places its array on the target's devices."""
  try:
    return set(sharding.device_set) <= set(devices)
  except (AttributeError, TypeError, ValueError):  # an abstract mesh has no devices
    return False


# ------------------------------------------------------------- resolve ----


def get_target(name: str | os.PathLike | Target, *, gpus: int | None = None,
               autotune_results: str | os.PathLike | None = None) -> Target:
  """The target a name, a spec file or a `Target` picks.

  Args:
    name: a GPU's name ("h200", "h100", "b200", "a100", ...: `list_targets()`
      lists them), a path to a `GpuTargetConfigProto` text file, a TPU
      generation ("v4", "v5e", "v5p", "v6e": one chip) or slice ("v5e:2x2",
      "v5p:2x2x1", as libtpu names topologies), or a `Target` (then `gpus`
      and `autotune_results` replace its own).
    gpus: devices in the topology (default 1); several give a mesh, and a
      sharded program's collectives are XLA:GPU's (NCCL).
    autotune_results: XLA autotune results dumped on a real GPU.

  Raises:
    TargetError: for an unknown name (the message lists the known ones), an
      unreadable spec or results file, or a device count below 1.
  """
  if isinstance(name, Target):
    target = name
  elif tpus.is_tpu_name(os.fspath(name)):
    topo = tpus.parse_topology(os.fspath(name))
    if gpus is not None or autotune_results is not None:
      raise TargetError(f"target {topo.name}: gpus and autotune_results are for GPUs; a "
                        "TPU target names its chips in its topology, e.g. 'v5e:2x2'")
    return Target(name=topo.generation.name if topo.chips == 1 else topo.name,
                  platform="tpu", device_kind=topo.generation.device_kind,
                  device_count=topo.device_count, tpu=topo)
  else:
    try:
      spec = specs_mod.find_spec(name)
    except TargetError as e:
      if not str(e).startswith("unknown target"):
        raise
      raise TargetError(f"{e}; or a TPU: " + ", ".join(g.name for g in tpus.GENERATIONS)
                        + " (one chip) or a slice such as 'v5e:2x2'") from None
    if not spec.is_cuda:
      raise TargetError(f"target {spec.name!r} ({spec.device_kind or 'no device_description_str'}) "
                        "is not a CUDA GPU (its spec has no cuda_compute_capability): the "
                        "CUDA plugin cannot compile for it")
    target = Target(name=spec.name, platform="cuda", device_kind=spec.device_kind,
                    spec=spec)
  if gpus is not None:
    if gpus < 1:
      raise TargetError(f"gpus={gpus}: expected a positive number of devices")
    target = dataclasses.replace(target, device_count=gpus)
  if autotune_results is not None:
    path = os.fspath(autotune_results)
    if not os.path.isfile(path):
      raise TargetError(f"autotune results {path!r}: no such file")
    target = dataclasses.replace(target, autotune_results=os.path.abspath(path))
  return target


def resolve_target(target: str | os.PathLike | Target | None, *,
                   gpus: int | None = None,
                   autotune_results: str | os.PathLike | None = None) -> Target | None:
  """`get_target` for an optional `target=` argument: None stays None.

  Raises:
    TargetError: as `get_target`, and for `gpus` or `autotune_results`
      without a target.
  """
  if target is None:
    if gpus is not None or autotune_results is not None:
      raise TargetError("gpus and autotune_results need a target (e.g. target='h200')")
    return None
  return get_target(target, gpus=gpus, autotune_results=autotune_results)


def device_facts(name: str | os.PathLike | Target | DeviceFacts) -> DeviceFacts:
  """What a device does per second, with each fact's source: a GPU target
  ("h200", "h100", a spec file, a `Target`, or what jax calls the device,
  "NVIDIA H200 141GB HBM3e": from XLA's spec of it), or
  "cpu" (this machine's CPU, measured once and cached: `hlo-audit
  calibrate`).

  Raises:
    TargetError: for an unknown name (the message lists the known ones).
  """
  if isinstance(name, DeviceFacts):
    return name
  if isinstance(name, Target):
    if name.tpu is not None:
      return tpus.tpu_facts(name.tpu.generation)
    if name.spec is None:
      raise TargetError(f"target {name.label}: no spec to read its facts from")
    return devices.gpu_facts(name.spec)
  if os.fspath(name).strip().lower() in ("cpu", "host"):
    return calibration.cpu_facts()
  if tpus.is_tpu_name(os.fspath(name)):
    return tpus.tpu_facts(tpus.parse_topology(os.fspath(name)).generation)
  gen = tpus.generation_of(os.fspath(name))  # what jax calls a TPU device
  if gen is not None:
    return tpus.tpu_facts(gen)
  for spec in specs_mod.known_specs():  # what jax calls it: a device's kind
    if spec.device_kind == name:
      return devices.gpu_facts(spec)
  return devices.gpu_facts(specs_mod.find_spec(name))


def facts_for_device_kind(platform: str, device_kind: str) -> DeviceFacts | None:
  """The facts of the device a module was compiled for, from what jax calls
  it: this machine's CPU, a GPU XLA has a spec for, or a TPU generation;
  None when unknown."""
  platform = (platform or "").lower()
  if platform in ("cpu", "host"):
    return calibration.cpu_facts()
  if platform == "tpu":
    gen = tpus.generation_of(device_kind)
    return tpus.tpu_facts(gen) if gen is not None else None
  if platform in ("gpu", "cuda") and device_kind:
    for spec in specs_mod.known_specs():
      if spec.device_kind == device_kind:
        return devices.gpu_facts(spec)
  return None


def list_targets() -> tuple[GpuSpec, ...]:
  """Every GPU a target name can pick (the installed plugin's specs, and
  hlo-audit's copies of the others), by name."""
  return specs_mod.known_specs()


# ------------------------------------------------------------ topology ----

_lock = threading.Lock()
_topologies: dict[tuple[str, str, int], Any] = {}


def _topology(target: Target):
  """The compile-only topology of `target`, built once per process."""
  if target.tpu is not None:
    key = (target.platform, target.tpu.name, target.device_count)
  elif target.spec is None:
    raise TargetError(f"target {target.label}: no spec to build a topology from")
  else:
    key = (target.platform, target.spec.text, target.device_count)
  with _lock:
    topo = _topologies.get(key)
    if topo is None:
      build = _build_tpu_topology if target.tpu is not None else _build_topology
      topo = _topologies[key] = build(target)
  return topo


#: libtpu's default host of a compile-only slice: 2x2x1 chips. A slice that
#: does not tile by it (one chip, 1x2) is built as one host of its own size.
_DEFAULT_HOST = (2, 2, 1)


def _build_tpu_topology(target: Target):
  wheels.require_tpu_wheel()
  wheels.prepare_libtpu()
  from jax.experimental import topologies

  topo = target.tpu
  dims = topo.dims + (1,) * (3 - len(topo.dims))
  kwargs = {}
  if any(d % h for d, h in zip(dims, _DEFAULT_HOST)):
    kwargs["chips_per_host_bounds"] = list(dims)
  try:
    with wheels.libtpu_quietly():
      return topologies.get_topology_desc(topology_name=topo.name, platform="tpu", **kwargs)
  except Exception as e:  # noqa: BLE001 - libtpu's errors carry no type of their own
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if "lockfile" in text:
      first = ("another process holds libtpu's lockfile (/tmp/libtpu_lockfile); start "
               "that process with ALLOW_MULTIPLE_LIBTPU_LOAD=1 in its environment, or "
               "end it")
    raise TargetError(f"target {topo.name}: libtpu could not build the topology: "
                      f"{first}") from None


def _build_topology(target: Target):
  wheels.require_gpu_wheels()
  from jax.experimental import topologies

  text = specs_mod.for_installed_xla(target.spec)
  try:
    return topologies.get_topology_desc(
        "", platform=target.platform, target_config=text,
        topology=f"1x1x{target.device_count}")
  except NotImplementedError:
    raise TargetError(
        "the CUDA plugin did not start in this process: set JAX_PLATFORMS=cpu "
        "before JAX starts (without it, the plugin looks for cuDNN and a GPU and "
        "gives up)") from None
  except Exception as e:  # noqa: BLE001 - XLA's errors carry no type of their own
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise TargetError(f"target {target.label}: XLA rejected the spec "
                      f"({target.spec.source}): {first}") from None

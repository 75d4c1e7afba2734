"""What differs between the JAX versions pallas_kernels supports, in one place.

Supported: jax/jaxlib 0.10.2 up to the newest 0.12.x (README, "Supported
versions"). Code elsewhere asks this module instead of reading
`jax.__version__`, probing with `hasattr` or catching ImportError, so that each
version difference is written down once, with the versions it covers.

Sections:
  * Versions: the installed jax and jaxlib as comparable tuples.
  * Pallas Triton backend: its module and compiler params (absent -> None), the
    deprecation JAX 0.11 added (warned once by us, jax's per-lowering warning
    silenced), and whether it lowers without a GPU.
  * Pallas Mosaic GPU backend: its module, whether this JAX can run it in
    interpret mode (what validation on a CPU needs), its interpret params.
  * Jaxpr parameters: how control-flow primitives describe their operands
    (scan's `num_consts`/`num_carry` became a FlatTree `ft_in` in 0.11).
  * Target devices: lowering for a GPU this machine does not have.

Facts about jaxlib's XLA (its parser, its HLO) live in
`hlo_audit/_src/compat.py`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jaxlib import version as jaxlib_version

# ------------------------------------------------------------- versions ----

# JAX's own parse of its versions (e.g. 0.12.0.1 -> (0, 12, 0, 1)).
JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__)
JAXLIB_VERSION: tuple[int, ...] = tuple(jaxlib_version.__version_info__)

# ------------------------------------------------ Pallas Triton backend ----

try:
  # Deprecated since JAX 0.11 and slated for removal; importing it may warn.
  # Without it the ops fall back to XLA (see `gpu.unavailable_reason`).
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover - depends on the installed JAX.
  _triton = None

#: `jax.experimental.pallas.triton` (masked `load`/`store`), or None.
pallas_triton: Any = _triton

#: Triton's compiler-params class for `pallas_call`, or None. JAX >= 0.5 names
#: it `CompilerParams`; older ones `TritonCompilerParams`.
TRITON_COMPILER_PARAMS: Any = None
if _triton is not None:
  TRITON_COMPILER_PARAMS = (getattr(_triton, "CompilerParams", None)
                            or getattr(_triton, "TritonCompilerParams", None))

#: Up to jaxlib 0.10.2 Pallas embeds Triton IR in a custom call when lowering,
#: so a CPU-only machine can lower for CUDA; newer jaxlibs compile the IR then,
#: which needs the CUDA plugin (and a GPU).
TRITON_LOWERS_WITHOUT_GPU: bool = JAXLIB_VERSION <= (0, 10, 2)

#: JAX >= 0.11 deprecates the Triton backend and warns at every lowering.
TRITON_DEPRECATED: bool = JAX_VERSION >= (0, 11)

#: The start of jax's warning (a DeprecationWarning, at every lowering).
JAX_TRITON_WARNING = "The Pallas Triton backend is deprecated"

#: The one warning we give instead (a FutureWarning: shown to users by
#: default, once per process).
TRITON_NOTICE = (
    "pallas_kernels compiles this kernel through Pallas's Triton backend, which "
    "JAX deprecates since 0.11 (this is jax {jax}; its warning at every lowering "
    "is silenced, this one is given once). On Hopper GPUs the matmul is a Mosaic "
    "GPU kernel; the row ops (layer_norm, rms_norm, softmax), and the matmul on "
    "other GPUs, stay on Triton while JAX ships it; once a JAX release drops it, "
    "those ops fall back to XLA, listed by pallas_kernels.fallbacks().")

_noticed = False


def triton_compiler_params(*, num_warps: int, num_stages: int) -> Any:
  """Triton compiler params for a compiled (not interpreted) `pallas_call`.

  Building them means a Triton lowering follows: on a JAX that deprecates the
  backend, this gives our notice once and silences jax's per-lowering warning
  (the filter is re-added each time, since `warnings.catch_warnings` blocks,
  pytest's included, restore the filters on exit).

  Returns:
    An instance of `TRITON_COMPILER_PARAMS`, or None when this JAX has none
    (the guards keep such a JAX from compiling).
  """
  global _noticed
  if TRITON_DEPRECATED:
    warnings.filterwarnings("ignore", message=re.escape(JAX_TRITON_WARNING),
                            category=DeprecationWarning)
    if not _noticed:
      _noticed = True
      warnings.warn(TRITON_NOTICE.format(jax=jax.__version__), FutureWarning,
                    stacklevel=2)
  if TRITON_COMPILER_PARAMS is None:
    return None
  return TRITON_COMPILER_PARAMS(num_warps=num_warps, num_stages=num_stages)


# --------------------------------------------- Pallas Mosaic GPU backend ----
# `jax.experimental.pallas.mosaic_gpu` (plgpu): TMA copies, wgmma, warp
# specialization. Present in 0.10.2 but without an interpret mode: nothing
# could validate a kernel on a CPU there, so our Mosaic GPU kernels start at
# 0.11 (`InterpretGPUParams`, `plgpu.kernel(..., interpret=)`). 0.12 added
# `plgpu.store`/`max`/`sum`; the kernels use neither.

try:
  from jax.experimental.pallas import mosaic_gpu as _mosaic_gpu
except ImportError:  # pragma: no cover - depends on the installed JAX.
  _mosaic_gpu = None

#: `jax.experimental.pallas.mosaic_gpu`, or None.
pallas_mosaic_gpu: Any = _mosaic_gpu

#: Whether our Mosaic GPU kernels can run here (compiled on Hopper, or
#: interpreted on a CPU): jax >= 0.11 with Mosaic GPU's interpret mode.
MOSAIC_GPU_SUPPORTED: bool = (
    _mosaic_gpu is not None and JAX_VERSION >= (0, 11)
    and hasattr(_mosaic_gpu, "InterpretGPUParams"))


def mosaic_gpu_unavailable_reason() -> str | None:
  """Why this JAX cannot run our Mosaic GPU kernels, or None."""
  if _mosaic_gpu is None:
    return "this JAX has no jax.experimental.pallas.mosaic_gpu"
  if not MOSAIC_GPU_SUPPORTED:
    return (f"jax {jax.__version__}'s Mosaic GPU has no interpret mode to validate "
            "kernels with; the Mosaic GPU kernels need jax >= 0.11")
  return None


def mosaic_interpret_params() -> Any:
  """`interpret=` of `plgpu.kernel` that runs it on the CPU."""
  return _mosaic_gpu.InterpretGPUParams()


# ----------------------------------------------------- jaxpr parameters ----


def scan_layout(params: Mapping[str, Any]) -> tuple[int, int]:
  """(consts, carry): how many of a `scan` equation's operands are constants
  and how many the carry (the rest are the scanned-over xs).

  jax <= 0.10 has `num_consts`/`num_carry`; 0.11 replaced them with FlatTrees
  `ft_in` = (consts, carry, xs) and `ft_out` = (carry, ys).
  """
  if "num_consts" in params:
    return int(params["num_consts"]), int(params["num_carry"])
  if "ft_in" in params:
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)
  raise NotImplementedError(
      "this JAX's scan has neither num_consts/num_carry nor ft_in; known "
      f"params: {sorted(params)}")


def split_scan_operands(params: Mapping[str, Any],
                        operands: Sequence[Any]) -> tuple[list, list, list]:
  """A scan equation's operands as (consts, carry init, xs)."""
  n_consts, n_carry = scan_layout(params)
  ops = list(operands)
  return ops[:n_consts], ops[n_consts:n_consts + n_carry], ops[n_consts + n_carry:]


# ------------------------------------------------------- target devices ----
# Lowering for a GPU this machine does not have. Every supported JAX has the
# public `jax.sharding.use_abstract_mesh` / `get_abstract_mesh` and an
# `AbstractMesh(..., abstract_device=AbstractDevice(kind, cores, platform))`;
# a mesh of no axes may carry a device, and values traced under it stay
# type-compatible with values traced outside (a `cond` may join them). What
# Pallas's Triton lowering does with it differs:
#   * jax <= 0.10.2 ignores the abstract device and, with no local GPU, lowers
#     for compute capability 9.0 (it embeds Triton IR at lowering time);
#   * jax >= 0.11 reads the abstract device's kind (a table in
#     `jax._src.pallas.triton.gpu_info`) and, with neither a GPU nor an abstract
#     GPU device, fails with "No supported GPU devices found". Each equation
#     records the abstract mesh it was traced under and its lowering re-enters
#     it, so a kernel traced under one lowers for that device later.
# Where an operand is placed is seen at trace time only through a
# `NamedSharding` (its aval's mesh names the device); a `SingleDeviceSharding`
# leaves an empty mesh. The device a program is compiled for is known for sure
# only when it is lowered: `ModuleContext.backend` is the client compiling it
# (a compile-only topology's client names its GPUs), and
# `mlir.lower_per_platform` (internal, the same in 0.10.2 to 0.12) emits one
# rule per lowering platform.


def abstract_device() -> Any | None:
  """The `AbstractDevice` named by the current abstract mesh, or None.

  Read through the public `jax.sharding.get_abstract_mesh()`; a JAX without
  it, or a mesh without a device, gives None.
  """
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  if get is None:  # pragma: no cover - every supported JAX has it.
    return None
  mesh = get()
  return getattr(mesh, "abstract_device", None) if mesh is not None else None


def use_abstract_device(device_kind: str, num_cores: int | None, platform: str):
  """A context in which the abstract mesh names this device: the current
  mesh's axes (none outside any mesh) with the device swapped in."""
  current = jax.sharding.get_abstract_mesh()
  device = jax.sharding.AbstractDevice(device_kind, num_cores, platform)
  mesh = jax.sharding.AbstractMesh(
      tuple(current.axis_sizes), tuple(current.axis_names),
      axis_types=tuple(current.axis_types), abstract_device=device)
  return jax.sharding.use_abstract_mesh(mesh)


def placed_device(x: Any) -> Any | None:
  """The device (or `AbstractDevice`) an operand is placed on, or None.

  A concrete `jax.Array` names its devices; a traced value only through a
  `NamedSharding` in its aval, whose mesh carries the device.
  """
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    try:
      return next(iter(x.sharding.device_set))
    except (AttributeError, StopIteration):  # pragma: no cover - deleted arrays.
      return None
  try:
    sharding = jax.typeof(x).sharding
  except (AttributeError, TypeError):
    return None
  mesh = getattr(sharding, "mesh", None)
  device = getattr(mesh, "abstract_device", None)
  if device is not None:
    # A mesh of no axes naming a device is the one `use_abstract_device`
    # enters outside any mesh: a value computed in a deferred build's branch
    # for another GPU keeps it in its type after the branch ends, and would
    # pin the next op to that GPU. It counts only while still under it.
    if not tuple(getattr(mesh, "axis_names", ())) and device != abstract_device():
      return None
    return device
  if isinstance(mesh, jax.sharding.Mesh) and mesh.devices.size:
    return mesh.devices.flat[0]
  return None


def lowering_devices(ctx: Any) -> tuple[Any, ...]:
  """The devices of the client a lowering compiles for (a compile-only
  topology's GPUs included); () when the lowering has no single client."""
  try:
    client = ctx.module_context.backend
    return tuple(client.devices()) if client is not None else ()
  except Exception:  # noqa: BLE001 - several platforms: no single client.
    return ()


def lowering_platforms(ctx: Any) -> tuple[str, ...]:
  """The platforms a lowering rule emits for ("cpu", "cuda", ...)."""
  return tuple(ctx.platforms or ctx.module_context.platforms)


def lower_per_platform(ctx: Any, description: str, rules: Mapping[str, Any],
                       default_rule: Any) -> Sequence[Any]:
  """One lowering per platform of a multi-platform lowering (JAX's own, as
  `lax.platform_dependent` uses it)."""
  from jax._src import effects  # noqa: PLC0415 - internal, see above.
  from jax._src.interpreters import mlir as internal_mlir  # noqa: PLC0415
  return internal_mlir.lower_per_platform(ctx, description, dict(rules), default_rule,
                                          effects.no_effects)


def lowering_needs_abstract_gpu() -> bool:
  """Whether Pallas's Triton lowering needs an abstract GPU device (or a real
  GPU) to lower for "cuda": true from jax 0.11 on (see above)."""
  return JAX_VERSION >= (0, 11)

"""Facts that differ between the JAX/jaxlib versions hlo-audit supports
(0.10.2, 0.11.2, 0.12.x), each stated once."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------
# Compile reuse and XLA's memory reports (issue 14)
#
# Checked on jax/jaxlib 0.10.2, 0.11.2 and 0.12.0.1 (CPU):
# * `jit(f).lower(*args)` is cached by function and argument types (a new
#   `jax.jit(f)` object included), and `Lowered.compile()` *without*
#   `compiler_options` returns the executable of
#   `pxla._cached_compilation` (a weakref LRU cache keyed on the lowered
#   module and the options): the very executable `jit(f)(*args)` built and
#   runs. Any `compiler_options` (e.g. `xla_dump_to`) is part of that key, so
#   it always compiles again. The persistent compilation cache, when enabled
#   (`jax_compilation_cache_dir`), sits below this (its key includes the
#   compile options): `audit` in a fresh process then loads the executable
#   (a cache hit, checked on 0.10.2 and 0.12.0.1), and the loaded executable
#   still carries its buffer-assignment proto.
# * `Compiled.memory_analysis()` is a `CompiledMemoryStats` carrying
#   `serialized_buffer_assignment_proto` (XLA's `BufferAssignmentProto`)
#   in all three; 0.11+ add `peak_unpadded_heap_bytes`,
#   `total_allocation_bytes` and `indefinite_allocations`.
# * The proto names values by instruction unique id; names come from
#   `runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()`
#   (all three). Live ranges are in no proto: only the dump reports have them.
# ---------------------------------------------------------------------------


def buffer_assignment_proto(memory_stats: Any) -> bytes | None:
  """XLA's serialized `BufferAssignmentProto` from `memory_analysis()`'s
  result, or None when this jaxlib or backend does not provide it."""
  proto = getattr(memory_stats, "serialized_buffer_assignment_proto", None)
  return bytes(proto) if proto else None


def hlo_module_proto(compiled: Any) -> bytes | None:
  """The serialized optimized `HloModuleProto` of a `jax.stages.Compiled`."""
  try:
    modules = compiled.runtime_executable().hlo_modules()
  except Exception:  # noqa: BLE001 - not every runtime exposes its modules
    return None
  if not modules:
    return None
  return bytes(modules[0].as_serialized_hlo_module_proto())

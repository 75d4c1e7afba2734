"""What differs between the jaxlib/XLA and Python versions hlo_audit supports.

Supported: Python 3.11-3.13 with jax/jaxlib 0.10.2 up to the newest 0.12.x
(README, "Supported versions"). Code elsewhere asks this module instead of
reading version numbers itself, so each difference is written down once, with
the versions it covers.

Sections:
  * Versions: the installed jax and jaxlib (from package metadata: importing
    this module imports neither), as text and comparable tuples.
  * XLA's HLO parser: what the installed jaxlib's parser builds differently.
  * XLA:GPU specs: what the installed XLA reads of a GPU's spec text.
  * CPython's collector: objects the interpreter itself freezes.
  * XLA:TPU (libtpu): what the libtpu that compiled a module does differently.
  * Compile reuse and XLA's memory reports: where an executable jit built
    keeps XLA's buffer assignment.

Facts about jax's tracing and Pallas live in `pallas_kernels/_src/compat.py`.
"""

from __future__ import annotations

import gc
import importlib.metadata
import re
import sys
from typing import Any

# ------------------------------------------------------------- versions ----


# Public as `hlo_audit.parse_version` (it imports without jax).
def parse_version(text: str) -> tuple[int, ...]:
  """"0.12.0.1" -> (0, 12, 0, 1); a suffix ("0.11.0rc1", ".dev2026") ends it."""
  out = []
  for part in text.split("."):
    m = re.match(r"\d+", part)
    if not m:
      break
    out.append(int(m.group()))
    if m.end() != len(part):
      break
  return tuple(out)


def _installed(dist: str) -> str:
  # From the package metadata, so that the parser need not import jax.
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return ""


JAX_VERSION_TEXT: str = _installed("jax")
JAXLIB_VERSION_TEXT: str = _installed("jaxlib")
#: () when jaxlib is not installed: the XLA facts below then follow the
#: newest jaxlib.
JAXLIB_VERSION: tuple[int, ...] = parse_version(JAXLIB_VERSION_TEXT)


def _jaxlib_at_least(*version: int) -> bool:
  return not JAXLIB_VERSION or JAXLIB_VERSION >= version


# ---------------------------------------------------- XLA's HLO parser ----

#: Since jaxlib 0.11 a `call-start` or `fusion-start` with fewer operands than
#: its computation has parameters (`call-start(), to_apply=c`: "partially
#: bound") gets the missing ones as `async_param` parameters of the wrapper XLA
#: builds, after the wrapped op; up to 0.10.2 the wrapper holds the op alone.
XLA_ASYNC_START_BINDS_MISSING_PARAMS: bool = _jaxlib_at_least(0, 11)

#: Since jaxlib 0.11 XLA's dumps write a get-tuple-element they leave out as
#: an operand `%t#0` (`%t#1#0` nested), and its parser reads them back,
#: making the get-tuple-element right before its first reader, named `t_0`
#: (made unique). hlo_audit reads them on every jaxlib: dumps travel between
#: machines; 0.10.2's own parser rejects them.
XLA_PARSES_TUPLE_ELEMENT_OPERANDS: bool = _jaxlib_at_least(0, 11)

# ----------------------------------------------------- XLA:GPU specs ----

#: Fields of XLA's GPU spec protos that the installed jaxlib's XLA does not
#: know, dropped from a spec before it is parsed (one unknown field fails the
#: whole text). Found by parsing every spec of jax-cuda12-pjrt 0.12.0.1 with
#: the plugins of jaxlib 0.10.2, 0.11.2 and 0.12.0.1 (the error names the
#: field): 0.12 knows them all, 0.11 lacks the last, 0.10 all five. Older
#: XLA then works without those facts, as it did before it had them.
GPU_SPEC_FIELDS_UNKNOWN: tuple[str, ...] = (
    () if _jaxlib_at_least(0, 12) else
    ("oversized_shared_memory_per_block",) if _jaxlib_at_least(0, 11) else
    ("mem_clock_ghz", "reserved_shared_memory_per_block", "max_blocks_per_multiprocessor",
     "collective_memory_granularity", "oversized_shared_memory_per_block"))

# ---------------------------------------------------- CPython collector ----

#: Objects the interpreter leaves in the permanent generation at start-up.
#: CPython 3.12 freezes a few hundred tuples of its own (375 on 3.12.1), 3.11
#: and 3.13 none. Read when hlo_audit is imported, which is exact unless the
#: program froze objects before importing it (then those count as the
#: interpreter's too).
INTERPRETER_FROZEN_AT_START: int = (gc.get_freeze_count()
                                    if sys.version_info[:2] == (3, 12) else 0)


# ---------------------------------------------------- XLA:TPU (libtpu) ----


def libtpu_temporaries_share_outputs(libtpu_version: str) -> bool:
  """Whether XLA:TPU of `libtpu_version` (the libtpu that compiled a
  module; "" unknown) lets a temporary take an output's allocation before the
  output is written. Read from the buffer-assignment dumps of the eight
  programs of scripts/bench_tpu_target.py: libtpu 0.0.42.1 puts temporaries
  in outputs' allocations (the MLP's 8 MiB activation; 74 of the decoder's
  107 output allocations), 0.0.50.1 gives every output an allocation of its
  own and keeps every temporary in the heap (none of 312 output allocations
  holds a second value). Versions between were not compiled. HLO text alone
  says neither; unknown gets 0.0.42.1's, the committed TPU fixtures'
  compiler."""
  return not libtpu_version or parse_version(libtpu_version) < (0, 0, 50)


# ---------------------------------------------------------------------------
# Compile reuse and XLA's memory reports
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
#   compile options, less the `xla_dump_*` ones, which jax's cache key
#   drops): `audit` in a fresh process then loads the executable (a cache
#   hit, checked on 0.10.2 and 0.12.0.1), and the loaded executable still
#   carries its buffer-assignment proto; but the dump compile of
#   `xla_reports=True` loads it too, and XLA writes no reports (all three).
# * `Compiled.memory_analysis()` is a `CompiledMemoryStats` carrying
#   `serialized_buffer_assignment_proto` (XLA's `BufferAssignmentProto`)
#   in all three; 0.11+ add `peak_unpadded_heap_bytes`,
#   `total_allocation_bytes` and `indefinite_allocations`.
# * The proto names values by instruction unique id; names come from
#   `runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()`
#   (all three). Live ranges are in no proto: only the dump reports have them.
# ---------------------------------------------------------------------------


def persistent_cache_dir() -> str | None:
  """The folder of JAX's persistent compilation cache when it is on, else
  None (a compile may then load an executable, and XLA writes no reports)."""
  import jax

  if not jax.config.jax_enable_compilation_cache:
    return None
  return jax.config.jax_compilation_cache_dir or None


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

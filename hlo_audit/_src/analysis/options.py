"""The audit's thresholds: one frozen value instead of module constants."""

from __future__ import annotations

import dataclasses
from typing import Any

from hlo_audit._src.analysis import source as source_mod


@dataclasses.dataclass(frozen=True, slots=True)
class AuditOptions:
  """Thresholds of the audit; one frozen value instead of module constants."""

  #: Buffers at least this fraction of peak memory make the intermediate-
  #: tensor table (the method says 1%).
  intermediate_fraction: float = 0.01
  #: Findings saving fewer bytes than this are dropped (noise).
  min_bytes_saved: int = 4096
  #: A buffer read by at least this many kernels is "worth keeping".
  keep_min_consumers: int = 2
  #: Keep-reuse records only for buffers at least this fraction of peak.
  keep_fraction: float = 0.01
  #: Regexes of source paths that are not the user's code (searched in the
  #: '/'-separated path): a finding cites the innermost frame outside them.
  library_paths: tuple[str, ...] = source_mod.DEFAULT_LIBRARY_PATHS
  #: Regexes of source paths that are the user's even where `library_paths`
  #: match (e.g. your own package installed in site-packages).
  user_paths: tuple[str, ...] = source_mod.DEFAULT_USER_PATHS
  #: The kernel libraries to consult, by name (None: every installed one;
  #: (): none, as if none were installed).
  kernel_libraries: tuple[str, ...] | None = None
  #: The device whose facts price the kernels' time: a name ("h200", "cpu":
  #: `hlo_audit.device_facts`) or a `DeviceFacts`; None: the device the
  #: module was compiled for, where known.
  device: Any = None


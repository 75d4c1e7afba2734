"""Suggested kernel calls: every finding a library op closes gets a
ready-to-paste call with the finding's shapes and dtypes, and the op's guard
verdict for them, both written by the library that owns the op (the seam,
`kernel_library.py`). The library reads the anchor's shapes through
`anchors.py`; a library that fails on a finding leaves it without a call and
says why in the verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from hlo_audit._src.analysis import anchors
from hlo_audit._src.analysis.kernel_library import Libraries
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, with_changes
from hlo_audit._src.hlo.ir import HloModule

_CLASSES = (FindingKind.UNFUSED_EPILOGUE, FindingKind.UNFUSED_PROLOGUE,
            FindingKind.SEPARATE_REDUCTION)


def add_suggestions(findings: tuple[FusionDecisionRecord, ...], module: HloModule,
                    libraries: Libraries, device=None) -> tuple[FusionDecisionRecord, ...]:
  """`findings` with `suggestion` and `guard_verdict` filled where a
  library's op closes the finding; `device` (`DeviceFacts`, None: unknown)
  goes to the libraries whose `suggest` takes it."""
  out = []
  try:
    for f in findings:
      lib = libraries.owner(f.kernel) if f.kind in _CLASSES and f.kernel else None
      if lib is None:
        out.append(f)
        continue
      try:
        s = (lib.suggest(f, module, device=device) if _takes_device(type(lib))
             else lib.suggest(f, module))
      except Exception as e:  # noqa: BLE001 - a plug-in's failure is reported, not raised.
        out.append(dataclasses.replace(
            f, guard_verdict=f"guard not evaluated: {lib.name} failed: "
                             f"{type(e).__name__}: {e}"))
        continue
      out.append(f if s is None else
                 with_changes(f, suggestion=s.call, guard_verdict=s.guard_verdict))
  finally:
    anchors.forget(module)
  return tuple(out)


@functools.cache
def _takes_device(library_type: type) -> bool:
  """Whether a library's `suggest` takes the audited device (a keyword the
  protocol added later: older libraries write calls without it)."""
  try:
    return "device" in inspect.signature(library_type.suggest).parameters
  except (TypeError, ValueError):
    return False

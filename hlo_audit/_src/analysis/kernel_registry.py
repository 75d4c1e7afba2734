"""Which `pallas_kernels` op closes which gap: the one registry the audit
consults (and `pallas_kernels`' tests hold against the kernels' real API).

Plain data, no JAX: the audit must run where only HLO text is at hand.
"""

from __future__ import annotations

import dataclasses

from hlo_audit._src.analysis.records import FindingKind


@dataclasses.dataclass(frozen=True, slots=True)
class KernelCapability:
  """What one kernel op fuses."""

  #: Public name, e.g. "pallas_kernels.matmul".
  op: str
  #: Finding kinds it closes.
  closes: frozenset[FindingKind]
  #: Anchor computations it performs ("dot", "layer_norm", ...).
  anchors: frozenset[str]
  #: Epilogue work it fuses after the anchor.
  epilogues: frozenset[str] = frozenset()
  #: Prologue work it fuses before the anchor.
  prologues: frozenset[str] = frozenset()
  #: Activation names its `activation=` takes.
  activations: frozenset[str] = frozenset()
  #: The keyword arguments the kernel exposes for each epilogue/prologue item
  #: (checked against the kernel's signature by pallas_kernels' tests).
  keywords: tuple[tuple[str, str], ...] = ()


REGISTRY: tuple[KernelCapability, ...] = (
    KernelCapability(
        op="pallas_kernels.matmul",
        closes=frozenset({FindingKind.UNFUSED_EPILOGUE, FindingKind.UNFUSED_PROLOGUE,
                          FindingKind.LAYOUT_CONFLICT}),
        anchors=frozenset({"dot"}),
        epilogues=frozenset({"bias", "scale", "activation", "residual", "clamp",
                             "cast", "quantize", "transpose"}),
        prologues=frozenset({"cast", "dequantize", "scale", "transpose"}),
        activations=frozenset({"relu", "gelu", "gelu_tanh", "silu", "sigmoid",
                               "tanh", "identity"}),
        keywords=(("bias", "bias"), ("activation", "activation"),
                  ("residual", "residual"), ("cast", "out_dtype"))),
    KernelCapability(
        op="pallas_kernels.layer_norm",
        closes=frozenset({FindingKind.SEPARATE_REDUCTION, FindingKind.UNFUSED_PROLOGUE}),
        anchors=frozenset({"layer_norm"}),
        epilogues=frozenset({"cast", "quantize"}),
        prologues=frozenset({"residual"}),
        keywords=(("residual", "residual"), ("cast", "out_dtype"))),
    KernelCapability(
        op="pallas_kernels.rms_norm",
        closes=frozenset({FindingKind.SEPARATE_REDUCTION, FindingKind.UNFUSED_PROLOGUE}),
        anchors=frozenset({"rms_norm"}),
        epilogues=frozenset({"cast", "quantize"}),
        prologues=frozenset({"residual"}),
        keywords=(("residual", "residual"), ("cast", "out_dtype"))),
    KernelCapability(
        op="pallas_kernels.softmax",
        closes=frozenset({FindingKind.SEPARATE_REDUCTION}),
        anchors=frozenset({"softmax"}),
        epilogues=frozenset({"cast"}),
        prologues=frozenset({"scale", "mask"}),
        keywords=(("scale", "scale"), ("mask", "mask"), ("cast", "out_dtype"))),
)


def kernel_for(kind: FindingKind, anchor: str, ops: tuple[str, ...]) -> str | None:
  """The op that closes a finding of `kind` around `anchor` doing `ops`
  (e.g. ("bias", "activation:gelu")), or None when no kernel covers all of
  the work."""
  for cap in REGISTRY:
    if kind not in cap.closes or anchor not in cap.anchors:
      continue
    allowed = cap.epilogues | cap.prologues
    ok = True
    for op in ops:
      base, _, arg = op.partition(":")
      if base not in allowed:
        ok = False
        break
      if base == "activation" and arg and arg not in cap.activations:
        ok = False
        break
    if ok:
      return cap.op
  return None

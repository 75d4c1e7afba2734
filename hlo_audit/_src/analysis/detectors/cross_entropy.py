"""Cross-entropy heads: the findings on a large vocabulary's logits and their
gradient share one fix.

A language model's head writes logits [tokens, vocab] from a gemm of the
hidden states and a [dim, vocab] weight, reduces them over the vocabulary
(max, sum of exp) for the log-softmax, and, in the backward, writes their
gradient (softmax minus the one-hot labels) for the input and weight gradient
gemms and the bias gradient's column sum. Each of these boundaries is a
finding of its own (a separate reduction, an epilogue, a prologue), and no
per-boundary fusion removes the [tokens, vocab] buffers: only a fused linear
cross-entropy does, computing the projection, the log-softmax and the loss
chunk by chunk over the vocabulary (its backward recomputes each chunk of
logits). This pass finds the heads and gives every finding on their logits
or gradient that need (anchor "linear_cross_entropy", the logits gemm as its
`anchor_kernel`), so a kernel library can name the one call that closes
them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hlo_audit._src.analysis import anchors
from hlo_audit._src.analysis.detectors.common import (anchor_of, consumer_kernels,
                                                      fused_computation, primitives,
                                                      product)
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord, KernelNeed,
                                             with_changes)

#: The fused cross-entropy pays where the logits dwarf the hidden states
#: they are computed from: a vocabulary at least this many times the model
#: dimension (a 10-class classifier's logits are cheaper than its features).
VOCAB_RATIO = 4

#: Finding classes a fused cross-entropy closes on the logits' boundaries.
_CLOSED = (FindingKind.SEPARATE_REDUCTION, FindingKind.UNFUSED_EPILOGUE,
           FindingKind.UNFUSED_PROLOGUE)

#: What the softmax over the vocabulary runs: the row max, exp for the sum.
_SOFTMAX = frozenset({"exp", "exponential"})


@dataclasses.dataclass(frozen=True, slots=True)
class Head:
  """A cross-entropy head: the gemm writing [tokens, vocab] logits."""

  #: The kernel running the logits gemm, and its computation.
  kernel: str
  computation: str
  tokens: int
  vocab: int
  dim: int
  #: The logits buffer's shape as the report prints it.
  logits: str
  #: The buffers computed from the logits one value per token and class
  #: (their exp, the softmax, its gradient): the boundaries the fused
  #: cross-entropy never writes.
  region: frozenset[str] = frozenset()


def heads(program: Program) -> tuple[Head, ...]:
  """The gemms of `program` that write a large vocabulary's logits, read by
  a softmax over the vocabulary (a reduction and an exp among the readers).
  The gemm takes no batch dimensions and a 2-D weight: attention's score
  gemms (batched, of two activations) are not heads."""
  found = []
  for k in program.kernels.values():
    if anchor_of(program, k) != "dot":
      continue
    try:
      mm = anchors.matmul_anchor(program.module, k.computation, k.name)
    except KeyError:
      continue
    if mm is None or mm.lhs_contracting is None or mm.lhs_batch or len(mm.rhs.dims) != 2:
      continue
    dim = product(mm.lhs.dims[i] for i in mm.lhs_contracting)
    vocab = product(d for i, d in enumerate(mm.rhs.dims) if i not in mm.rhs_contracting)
    tokens = product(d for i, d in enumerate(mm.lhs.dims) if i not in mm.lhs_contracting)
    if vocab < VOCAB_RATIO * dim:
      continue
    for buf in program.writes.get(k.name, ()):
      if not _is_logits(buf.dims, tokens, vocab):
        continue
      readers = consumer_kernels(program, buf)
      if any(_reduces_rows(program, r, tokens, vocab) for r in readers) and \
          any(primitives(program, r) & _SOFTMAX for r in readers):
        found.append(Head(k.name, k.computation, tokens, vocab, dim, buf.shape,
                          _region(program, buf.name, tokens, vocab)))
        break
  return tuple(found)


def _reduces_rows(program: Program, k: Kernel, tokens: int, vocab: int) -> bool:
  """Whether kernel `k` reduces a [tokens, vocab] array within its rows (the
  softmax's row max or sum; XLA:GPU may view a row as [128, 256] and reduce
  it in two stages). A SwiGLU's gemm, as wide as a small vocabulary, is
  reduced over its tokens in the backward, if at all."""
  fused = fused_computation(program, k)
  comp = fused if fused is not None else program.comps[k.computation]
  insts = fused.instructions if fused is not None else (program.inst(k),)
  for i in insts:
    if i.opcode != "reduce" or not i.operands or i.operands[0] not in comp:
      continue
    shape = comp.instruction(i.operands[0]).shape
    axes = i.dimensions or ()
    if shape is None or not shape.is_array or not axes or \
        product(shape.dims) != tokens * vocab:
      continue
    # The axes before the first reduced one count whole rows, or parts of
    # rows: what is reduced lies within one row.
    rows = product(shape.dims[:min(axes)])
    if rows >= tokens and rows % tokens == 0:
      return True
  return False


def _region(program: Program, logits: str, tokens: int, vocab: int) -> frozenset[str]:
  """The buffers computed from `logits` through buffers of one value per
  token and class: what the fused cross-entropy keeps on chip. (Another
  array of the same shape, say an MLP's hidden layer as wide as the
  vocabulary, is not computed from the logits.)"""
  region = {logits}
  stack = [logits]
  while stack:
    for reader in consumer_kernels(program, program.buffers[stack.pop()]):
      for out in program.writes.get(reader.name, ()):
        if out.name not in region and _is_logits(out.dims, tokens, vocab):
          region.add(out.name)
          stack.append(out.name)
  return frozenset(region)


def _is_logits(dims: Sequence[int], tokens: int, vocab: int) -> bool:
  """Whether an array of `dims` holds one value per token and vocabulary
  entry (the logits, their exp, their gradient), vocabulary last."""
  return bool(dims) and dims[-1] == vocab and product(dims) == tokens * vocab


def retarget(program: Program,
             findings: Sequence[FusionDecisionRecord]) -> list[FusionDecisionRecord]:
  """`findings` with those on a cross-entropy head's logits or gradient
  needing a fused linear cross-entropy."""
  found = heads(program)
  if not found:
    return list(findings)
  out = []
  for f in findings:
    head = next((h for h in found if f.boundary in h.region), None)
    if head is None or f.kind not in _CLOSED:
      out.append(f)
      continue
    out.append(with_changes(
        f, need=KernelNeed(f.kind, "linear_cross_entropy", anchor_kernel=head.kernel),
        evidence=f.evidence + (
            f"; {f.boundary_shape} is the logits (or their gradient) of a "
            f"cross-entropy over {head.vocab} classes, computed by {head.kernel} "
            f"({head.logits}): a fused linear cross-entropy computes the projection, "
            "the log-softmax and the loss chunk by chunk over the vocabulary (its "
            "backward recomputes each chunk), so neither the logits nor their "
            "gradient is written")))
  return out

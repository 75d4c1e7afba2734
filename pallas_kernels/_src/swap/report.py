"""What `swap` did: the patterns it replaced and those it left to XLA."""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True, slots=True)
class SwapSite:
  """One pattern found in the traced program."""

  #: Public op, e.g. "pallas_kernels.matmul".
  kernel: str
  #: The work the kernel takes over, e.g. "dot_general + bias + activation:gelu".
  pattern: str
  #: The call with the program's shapes, e.g. "matmul(x=f32[64,128], ...)".
  call: str
  #: Result(s), e.g. "f32[64,256]".
  output: str
  #: The user's line of the anchor equation, e.g. "model.py:12 (mlp)".
  source: str
  #: Where in the program: "" (top level), or e.g. "scan body".
  where: str
  replaced: bool
  #: Why it was left to XLA ("" when replaced).
  reason: str = ""
  #: (file, line) of every equation the pattern covers (to match audit
  #: findings, whose source is the line that made the buffer).
  locations: tuple[tuple[str, int], ...] = ()

  @property
  def status(self) -> str:
    return "replaced" if self.replaced else f"left to XLA: {self.reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class SwapReport:
  """The patterns `swap` found in one trace of a function.

  A pytree with no leaves, so `swap(f, report=True)` can return it from
  under `jax.jit` (it travels as static data).
  """

  function: str
  sites: tuple[SwapSite, ...]

  @property
  def replaced(self) -> tuple[SwapSite, ...]:
    return tuple(s for s in self.sites if s.replaced)

  @property
  def left(self) -> tuple[SwapSite, ...]:
    return tuple(s for s in self.sites if not s.replaced)

  def kernels(self) -> dict[str, int]:
    """Replacements per kernel, e.g. {"pallas_kernels.matmul": 3}."""
    out: dict[str, int] = {}
    for s in self.replaced:
      out[s.kernel] = out.get(s.kernel, 0) + 1
    return out

  def __str__(self) -> str:
    lines = [f"swap({self.function}): {len(self.replaced)} replaced, "
             f"{len(self.left)} left to XLA"]
    for s in self.sites:
      mark = "+" if s.replaced else "-"
      where = f" [{s.where}]" if s.where else ""
      lines.append(f"  {mark} {s.kernel}: {s.pattern} at {s.source or 'unknown'}{where}")
      lines.append(f"      {s.call} -> {s.output}")
      if not s.replaced:
        lines.append(f"      left to XLA: {s.reason}")
    return "\n".join(lines)

  def to_dict(self) -> dict:
    return {"function": self.function,
            "sites": [{**dataclasses.asdict(s), "locations": [list(l) for l in s.locations]}
                      for s in self.sites]}


jax.tree_util.register_pytree_node(
    SwapReport, lambda r: ((), r), lambda aux, _: aux)

"""The HLO IR: immutable modules, computations, instructions and shapes.

Every node is a frozen, slotted dataclass. Operands and called computations are
referred to by name: each computation indexes its instructions once, and the
module indexes its computations, so there are no object cycles and equality
and hashing stay cheap. (The IR holds read-only `MappingProxyType` views, so
it does not pickle; send HLO text or a report's JSON between processes.)

Attributes are kept as their raw text (`Instruction.attributes`) and decoded on
first use by the typed properties (`metadata`, `dimensions`, `window`, ...):
a dump of tens of thousands of instructions parses without decoding metadata
or backend configs it never needs. Decoding errors are `HloParseError`s that
point into the original text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hlo_audit._src.hlo import attributes as _attributes

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _empty() -> Mapping[str, Any]:
  return _EMPTY

# The value types live in values.py (the grammar and the attribute decoders
# build them without importing the IR); re-exported here.
from hlo_audit._src.hlo.values import COMBINE_DIMENSION as COMBINE_DIMENSION
from hlo_audit._src.hlo.values import UNBOUNDED as UNBOUNDED
from hlo_audit._src.hlo.values import Tile as Tile
from hlo_audit._src.hlo.values import Layout as Layout
from hlo_audit._src.hlo.values import Shape as Shape
from hlo_audit._src.hlo.values import ProgramShape as ProgramShape
from hlo_audit._src.hlo.values import SourceLocation as SourceLocation
from hlo_audit._src.hlo.values import Metadata as Metadata
from hlo_audit._src.hlo.values import FileLocation as FileLocation
from hlo_audit._src.hlo.values import StackFrame as StackFrame
from hlo_audit._src.hlo.values import StackFrameIndex as StackFrameIndex
from hlo_audit._src.hlo.values import SliceDim as SliceDim
from hlo_audit._src.hlo.values import WindowDim as WindowDim
from hlo_audit._src.hlo.values import PaddingDim as PaddingDim
from hlo_audit._src.hlo.values import DotDimensionNumbers as DotDimensionNumbers
from hlo_audit._src.hlo.values import ConvDimensionNumbers as ConvDimensionNumbers
from hlo_audit._src.hlo.values import OutputOperandAlias as OutputOperandAlias
from hlo_audit._src.hlo.values import ModuleAlias as ModuleAlias
from hlo_audit._src.hlo.values import TextContext as TextContext


#: Attributes that name computations, by role.
COMPUTATION_ROLES = ("calls", "to_apply", "condition", "body",
                     "branch_computations", "true_computation",
                     "false_computation", "select", "scatter",
                     "called_computations")


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Instruction:
  """One HLO instruction.

  Attributes are kept as written and split on first use (`attributes`); the
  typed views (`metadata`, `dimensions`, `window`, ...) decode them on first
  use and cache the result. A dump's instructions are mostly never asked for
  most of their attributes, which is why parsing can skip the work.
  """

  #: Name, unique in the module (XLA's uniquifier applied, `%` dropped).
  name: str
  #: Opcode as printed, e.g. "fusion", "get-tuple-element", "async-start".
  opcode: str
  #: Result shape; None only when the text omits a shape that cannot be
  #: inferred (XLA allows omitting inferable shapes).
  shape: Shape | None
  #: Operand instruction names, in order.
  operands: tuple[str, ...] = ()
  #: The attributes: a mapping of raw value text by name, or the raw text of
  #: the whole `, k=v, ...` run, split on first use. Read `attributes`.
  attribute_source: Mapping[str, str] | str = dataclasses.field(default_factory=_empty)
  #: Control predecessors' names (`control-predecessors={...}`).
  control_predecessors: tuple[str, ...] = ()
  #: Raw literal text of a constant, e.g. "{1, 2}" or "{...}" when elided.
  literal: str | None = None
  #: Parameter number of a parameter instruction.
  parameter_number: int | None = None
  #: For `X-start`/`X-update`/`X-done` forms of async ops: X's opcode.
  async_wrapped_opcode: str | None = None
  #: Offset of the instruction in the parsed text.
  offset: int = dataclasses.field(default=-1, repr=False)
  _ctx: TextContext | None = dataclasses.field(default=None, repr=False)
  _cache: dict | None = dataclasses.field(default=None, repr=False, init=False)

  @property
  def attributes(self) -> Mapping[str, str]:
    """Attributes as raw text by name, e.g. {"kind": "kLoop", "calls": "%f"}."""
    src = self.attribute_source
    if not isinstance(src, str):
      return src
    # Split once, then kept in place of the run: the run's text would
    # otherwise be held twice (it is most of a dump's text).
    split = _attributes.split_attributes(src, _Where(self, "", src))
    object.__setattr__(self, "attribute_source", split)
    return split

  def attribute(self, key: str) -> str | None:
    """The raw text of attribute `key` (None when absent), as `attributes`
    has it; read from the unsplit run where that is exact (`_unsplit_value`),
    so that asking one attribute does not split them all."""
    src = self.attribute_source
    if type(src) is str:
      if key not in src:
        return None
      # Kept as read (under `key=`, no decoded value's key): analyses ask a
      # fusion's kind, and attribution a metadata, again and again.
      slot = key + "="
      cache = self._cache
      if cache is not None:
        raw = cache.get(slot, _SPLIT)
        if raw is not _SPLIT:
          return raw
      raw = _unsplit_value(src, key)
      if raw is not _SPLIT:
        if cache is None:
          cache = {}
          object.__setattr__(self, "_cache", cache)
        cache[slot] = raw
        return raw
      src = self.attributes
    return src.get(key)

  def _key(self) -> tuple:
    return (self.name, self.opcode, self.shape, self.operands,
            tuple(sorted(self.attributes.items())), self.control_predecessors,
            self.literal, self.parameter_number, self.async_wrapped_opcode)

  def __eq__(self, other) -> bool:
    if not isinstance(other, Instruction):
      return NotImplemented
    return self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def _cached(self, key: str, decode):
    cache = self._cache
    if cache is None:
      cache = {}
      object.__setattr__(self, "_cache", cache)
    try:
      return cache[key]
    except KeyError:
      value = cache[key] = decode()
      return value

  def _decode(self, key: str, decoder, default=None):
    raw = self.attribute(key)
    if raw is None:
      return default
    # `_cached`, inline: no closure per read (every typed property comes here).
    cache = self._cache
    if cache is None:
      cache = {}
      object.__setattr__(self, "_cache", cache)
    elif key in cache:
      return cache[key]
    value = cache[key] = decoder(raw, _Where(self, key, raw))
    return value

  # --- structure -------------------------------------------------------------

  @property
  def called_computations(self) -> Mapping[str, tuple[str, ...]]:
    """Names of computations this instruction calls, by role ("calls",
    "to_apply", "condition", "body", "branch_computations", ...)."""
    def decode():
      src = self.attribute_source
      found = _simple_roles(src) if type(src) is str else None
      out = {}
      for role in COMPUTATION_ROLES:
        raw = self.attributes.get(role) if found is None else found.get(role)
        if raw is not None:
          names = _attributes.computation_list(raw, _Where(self, role, raw))
          renames = self._ctx.computation_renames if self._ctx else _EMPTY
          out[role] = tuple(renames.get(n, n) for n in names)
      return types.MappingProxyType(out) if out else _EMPTY
    cache = self._cache
    if cache is not None and "called_computations" in cache:
      return cache["called_computations"]
    src = self.attribute_source
    if not src or (isinstance(src, str) and not _may_call(src)):
      return _EMPTY  # (without splitting the run: callers() asks every instruction)
    return self._cached("called_computations", decode)

  def called_computation_names(self) -> tuple[str, ...]:
    """All called computations, in role order, without duplicates."""
    seen: dict[str, None] = {}
    for names in self.called_computations.values():
      for n in names:
        seen[n] = None
    return tuple(seen)

  @property
  def fusion_kind(self) -> str | None:
    """"kLoop", "kInput", "kOutput" or "kCustom" for fusions, else None."""
    return self.attribute("kind")

  @property
  def custom_call_target(self) -> str | None:
    return self._decode("custom_call_target", _attributes.string)

  @property
  def tuple_index(self) -> int | None:
    """`index=` of a get-tuple-element."""
    return self._decode("index", _attributes.integer)

  @property
  def dimensions(self) -> tuple[int, ...] | None:
    return self._decode("dimensions", _attributes.int_list)

  @property
  def slices(self) -> tuple[SliceDim, ...] | None:
    return self._decode("slice", _attributes.slice_ranges)

  @property
  def window(self) -> tuple[WindowDim, ...] | None:
    return self._decode("window", _attributes.window)

  @property
  def convolution_dimension_numbers(self) -> ConvDimensionNumbers | None:
    return self._decode("dim_labels", _attributes.dim_labels)

  @property
  def padding(self) -> tuple[PaddingDim, ...] | None:
    """A pad's `padding=` config."""
    return self._decode("padding", _attributes.padding_config)

  @property
  def dot_dimension_numbers(self) -> DotDimensionNumbers:
    """Batch and contracting dimensions of a dot (empty when unset)."""
    def get(key):
      return self._decode(key, _attributes.int_list, ())
    return self._cached("dot_dimension_numbers", lambda: DotDimensionNumbers(
        lhs_batch=get("lhs_batch_dims"), rhs_batch=get("rhs_batch_dims"),
        lhs_contracting=get("lhs_contracting_dims"),
        rhs_contracting=get("rhs_contracting_dims")))

  @property
  def metadata(self) -> Metadata:
    return self._decode("metadata", _attributes.metadata, _NO_METADATA)

  @property
  def op_name(self) -> str:
    """`metadata.op_name`, read without decoding the other attributes when
    they are still raw text (analyses ask this of every fused instruction)."""
    src = self.attribute_source
    if isinstance(src, str):
      # First (as JAX's dumps write nearly all) or after other attributes
      # (`dimensions={0}, to_apply=%r, metadata=`): with no string before
      # it, the first such run is at the top level when the braces before
      # it balance.
      at = src.find(_OP_NAME_FIRST)
      if at >= 0:
        head = src[:at]
        if '"' not in head and head.count("{") == head.count("}"):
          name = _plain_string(src, at + len(_OP_NAME_FIRST))
          if name is not None:
            return name
      start, m = _op_name_match(src)
      # Only a match outside any string or braced value counts: an even
      # number of quotes before it, none of them escaped, and as many '{' as
      # '}' outside the quotes (`frontend_attributes={k={metadata={...}}}`).
      if m is not None:
        top = start == 0  # the common case: metadata comes first
        if not top and not src.count('"', 0, start) % 2 and "\\" not in src[:start]:
          bare = _QUOTED.sub("", src[:start])
          top = bare.count("{") == bare.count("}")
        if top:
          body = m.group(1)
          return _attributes.unescape_text(body) if "\\" in body else body
      if "metadata=" not in src:
        return ""
    else:  # split: read the raw `{op_name="..." ...}` unless already decoded
      cache = self._cache
      if cache is not None and "metadata" in cache:
        return cache["metadata"].op_name
      raw = src.get("metadata")
      if raw is None:
        return ""
      if raw.startswith(_OP_NAME_RAW):
        name = _plain_string(raw, len(_OP_NAME_RAW))
        if name is not None:
          return name
    return self.metadata.op_name

  @property
  def backend_config(self) -> str | None:
    """The raw backend_config: a JSON dict or string, as written."""
    raw = self.attribute("backend_config")
    if raw is None:
      return None
    if raw.startswith('"'):
      return self._decode("backend_config", _attributes.string)
    return raw

  def backend_config_json(self) -> dict | None:
    """backend_config decoded as JSON; None if absent, empty or not JSON."""
    def decode():
      raw = self.backend_config
      if not raw:
        return None
      try:
        value = json.loads(raw)
      except (ValueError, RecursionError):  # deeply nested arrays recurse
        return None
      return value if isinstance(value, dict) else None
    return self._cached("backend_config_json", decode)

  @property
  def frontend_attributes(self) -> Mapping[str, str]:
    return self._decode("frontend_attributes", _attributes.string_map, _EMPTY)

  @property
  def sharding(self) -> str | None:
    """The raw sharding text, e.g. "{devices=[2,1]<=[2]}"."""
    return self.attribute("sharding")

  @property
  def output_to_operand_aliasing(self) -> tuple[OutputOperandAlias, ...]:
    return self._decode("output_to_operand_aliasing",
                        _attributes.output_operand_aliasing, ())

  @property
  def custom_call_schedule(self) -> str | None:
    return self.attribute("schedule")

  @property
  def parameter_replication(self) -> tuple[bool, ...] | None:
    return self._decode("parameter_replication", _attributes.bool_list)

  @property
  def channel_id(self) -> int | None:
    return self._decode("channel_id", _attributes.integer)

  @property
  def replica_groups(self) -> str | None:
    """The raw replica_groups text ("{{0,1},{2,3}}" or "[2,2]<=[4]")."""
    return self.attribute("replica_groups")

  def decode_all(self) -> None:
    """Decodes every attribute this module knows how to type.

    Raises:
      HloParseError: if an attribute's text is malformed.
    """
    for prop in _TYPED_PROPERTIES:
      getattr(self, prop)
    self.backend_config_json()


_NO_METADATA = Metadata()
_QUOTED = re.compile(r'"[^"]*"')
#: `role=` for a computation role anywhere in a raw attribute run: a run
#: without one calls nothing (one inside a string only costs a split).
_ROLE_KEY = re.compile(r"(?:^|[\s,])(?:" + "|".join(COMPUTATION_ROLES) + r")=")
#: A role attribute as the split reads it, its value one `%name` (the value
#: `attributes.computation_list` reads without the lexer), then the next
#: attribute or the end.
_SIMPLE_ROLE = re.compile(r", (" + "|".join(COMPUTATION_ROLES) +
                          r")=(" + _attributes.COMPUTATION_REF + r")(?=,|\Z)")
_OP_NAME = re.compile(
    r'(?:^|,)[ \t]*metadata=\{(?:op_type="[^"\\]*+(?:\\.[^"\\]*+)*+"[ \t]+)?'
    r'op_name="([^"\\]*+(?:\\.[^"\\]*+)*+)"')
#: How a run starts when metadata comes first and op_name first in it.
_OP_NAME_FIRST = ', metadata={op_name="'
#: How a split run's raw metadata starts when op_name comes first.
_OP_NAME_RAW = '{op_name="'
_METADATA_AT = re.compile(
    r'metadata=\{(?:op_type="[^"\\]*+(?:\\.[^"\\]*+)*+"[ \t]+)?'
    r'op_name="([^"\\]*+(?:\\.[^"\\]*+)*+)"')
#: Substrings every `role=` key contains (a fast test before `_ROLE_KEY`).
_ROLE_HINTS = ("calls=", "to_apply=", "condition=", "body=", "computation",
               "select=", "scatter=")


def _plain_string(text: str, start: int) -> str | None:
  """The string body from `start` to the next quote, or None when it holds
  an escape (the full decode reads those)."""
  end = text.find('"', start)
  if end < 0 or text.find("\\", start, end) >= 0:
    return None
  return text[start:end]


def op_names(instructions: Iterable[Instruction]) -> list[str]:
  """`op_name` of each instruction: what analyses ask of every fused
  instruction, with the common raw form read inline (a property call per
  instruction is a measurable share of an audit)."""
  first, n = _OP_NAME_FIRST, len(_OP_NAME_FIRST)
  out = []
  append = out.append
  for inst in instructions:
    src = inst.attribute_source
    if src.__class__ is str:
      # `op_name`'s first test, inline: metadata first, or after attributes
      # holding no string (`dimensions={0}, metadata=`), its name plain.
      at = src.find(first)
      if at == 0 or at > 0 and src.find('"', 0, at) < 0 and \
          src.count("{", 0, at) == src.count("}", 0, at):
        start = at + n
        end = src.find('"', start)
        if end > 0 and src.find("\\", start, end) < 0:
          append(src[start:end])
          continue
    append(inst.op_name)
  return out


def _op_name_match(src: str) -> tuple[int, re.Match | None]:
  """(start, match) of `_OP_NAME.search(src)`, found with `str.find` first:
  the regex alone tries every offset of runs that are mostly long strings."""
  at = src.find("metadata={")
  while at >= 0:
    head = src[:at].rstrip(" \t")
    if not head or head[-1] == ",":
      m = _METADATA_AT.match(src, at)
      if m is not None:
        return max(len(head) - 1, 0), m
    at = src.find("metadata={", at + 1)
  return -1, None


#: `_unsplit_value`'s answer when only the split can say.
_SPLIT = object()


def _unsplit_value(src: str, key: str) -> str | None | object:
  """The raw value of attribute `key` in the unsplit run `src` (None: it has
  none), or `_SPLIT` when reading it so is not exact. Exact: the first
  `, key=` outside strings and braces (an even number of quotes before it,
  none escaped, and balanced braces outside them) is an attribute of the run
  (a run kept unsplit is one the parser's pattern took whole), its value is
  what the split's `VALUE` takes there, and no other `key=` follows (the
  split would reject a repeated key)."""
  needle = ", " + key + "="
  at = src.find(needle)
  if at < 0:
    # The split's keys follow ',' and blanks: one with other blanks needs it.
    return None if src.find(key + "=") < 0 else _SPLIT
  if src.find(key + "=", 0, at) >= 0:
    return _SPLIT
  quotes = src.count('"', 0, at)
  if not quotes:
    if src.count("{", 0, at) != src.count("}", 0, at):
      return _SPLIT
  else:  # after metadata, say: its strings' braces are no structure
    if quotes % 2 or src.find("\\", 0, at) >= 0:
      return _SPLIT
    bare = _QUOTED.sub("", src[:at])
    if bare.count("{") != bare.count("}"):
      return _SPLIT
  m = _attributes.VALUE_AT.match(src, at + len(needle))
  if m is None:
    return _SPLIT
  end = m.end()
  if end != len(src) and src[end] != "," or src.find(key + "=", end) >= 0:
    return _SPLIT
  return m.group(0)


def _simple_roles(src: str) -> dict[str, str] | None:
  """{role: raw value} of an unsplit run whose every role key (`_ROLE_KEY`,
  a superset of the split's) is an attribute with a `%name` value: no
  string and balanced braces before it, once each. None otherwise (split
  the run): a fusion's `calls=%c` is read without splitting its metadata."""
  found = {}
  for m in _ROLE_KEY.finditer(src):
    at = m.start() - (src[m.start()] != ",")  # (`_ROLE_KEY` takes the space of ", ")
    key = _SIMPLE_ROLE.match(src, at) if at >= 0 else None
    if key is None or src.find('"', 0, at) >= 0 or \
        src.count("{", 0, at) != src.count("}", 0, at) or key.group(1) in found:
      return None
    found[key.group(1)] = key.group(2)
  return found


def _may_call(src: str) -> bool:
  """Whether a raw attribute run has a computation-role key."""
  return any(h in src for h in _ROLE_HINTS) and _ROLE_KEY.search(src) is not None
_TYPED_PROPERTIES = (
    "called_computations", "custom_call_target", "tuple_index", "dimensions",
    "slices", "window", "convolution_dimension_numbers", "padding",
    "dot_dimension_numbers", "metadata", "backend_config",
    "frontend_attributes", "output_to_operand_aliasing",
    "parameter_replication", "channel_id")


@dataclasses.dataclass(slots=True, eq=False)  # (not frozen: one per decode, built fast)
class _Where:
  """Where an attribute value sits, for decoder error messages."""

  instruction: Instruction
  key: str
  raw: str

  @property
  def ctx(self) -> TextContext | None:
    return self.instruction._ctx

  def offset(self) -> int:
    ctx = self.instruction._ctx
    if ctx is None or self.instruction.offset < 0:
      return -1
    if not self.key:  # the whole attribute run
      at = ctx.text.find(self.raw, self.instruction.offset)
      return at if at >= 0 else self.instruction.offset
    at = _value_offset(ctx.text, self.key, self.raw, self.instruction.offset)
    return at if at >= 0 else self.instruction.offset


@dataclasses.dataclass(frozen=True, slots=True)
class Computation:
  """A computation: instructions in text order, and its root."""

  name: str
  instructions: tuple[Instruction, ...]
  root_name: str
  is_entry: bool = False
  #: `execution_thread=` of the computation ("main" unless written).
  execution_thread: str = "main"
  offset: int = dataclasses.field(default=-1, compare=False, repr=False)
  _index: Mapping[str, Instruction] = dataclasses.field(
      default_factory=_empty, compare=False, repr=False, init=False)
  _parameters: tuple[Instruction, ...] | None = dataclasses.field(
      default=None, compare=False, repr=False, init=False)
  _op_names: tuple[str, ...] | None = dataclasses.field(
      default=None, compare=False, repr=False, init=False)

  def __post_init__(self):
    object.__setattr__(self, "_index", types.MappingProxyType(
        {i.name: i for i in self.instructions}))

  @property
  def op_names(self) -> tuple[str, ...]:
    """`op_name` of each instruction, in text order (read once: the kernel
    and buffer tables both ask it of every scheduled instruction)."""
    names = self._op_names
    if names is None:
      names = tuple(op_names(self.instructions))
      object.__setattr__(self, "_op_names", names)
    return names

  @property
  def root(self) -> Instruction:
    return self._index[self.root_name]

  def is_root(self, inst: Instruction | str) -> bool:
    """Whether `inst` (or the instruction of that name) is the root."""
    return (inst if isinstance(inst, str) else inst.name) == self.root_name

  @property
  def parameters(self) -> tuple[Instruction, ...]:
    """Parameter instructions ordered by parameter number."""
    params = self._parameters
    if params is None:  # (analyses ask this of every fused computation, often)
      params = tuple(sorted((i for i in self.instructions if i.opcode == "parameter"),
                            key=lambda i: i.parameter_number or 0))
      object.__setattr__(self, "_parameters", params)
    return params

  def instruction(self, name: str) -> Instruction:
    """The instruction called `name`.

    Raises:
      KeyError: naming the computation, if there is none.
    """
    try:
      return self._index[name]
    except KeyError:
      raise KeyError(f"no instruction {name!r} in computation {self.name!r}") from None

  def __contains__(self, name: str) -> bool:
    return name in self._index

  def __len__(self) -> int:
    return len(self.instructions)

  def __iter__(self) -> Iterator[Instruction]:
    return iter(self.instructions)


@dataclasses.dataclass(frozen=True, slots=True)
class HloModule:
  """A parsed HLO module."""

  name: str
  #: Computations in XLA's order (callees usually before callers).
  computations: tuple[Computation, ...]
  entry_name: str
  #: Header attributes as raw text (`is_scheduled`, `entry_computation_layout`,
  #: `input_output_alias`, ...).
  attributes: Mapping[str, str] = dataclasses.field(default_factory=_empty)
  #: The FileNames/FunctionNames/FileLocations/StackFrames tables, if present.
  stack_frame_index: StackFrameIndex | None = None
  _ctx: TextContext | None = dataclasses.field(
      default=None, compare=False, repr=False)
  _index: Mapping[str, Computation] = dataclasses.field(
      default_factory=_empty, compare=False, repr=False, init=False)
  _cache: dict | None = dataclasses.field(
      default=None, compare=False, repr=False, init=False)

  def __post_init__(self):
    object.__setattr__(self, "_index", types.MappingProxyType(
        {c.name: c for c in self.computations}))

  def _cached(self, key, decode):
    cache = self._cache
    if cache is None:
      cache = {}
      object.__setattr__(self, "_cache", cache)
    if key not in cache:
      cache[key] = decode()
    return cache[key]

  def _forget(self, key) -> None:
    """Drops what `_cached` keeps under `key` (tables only an audit needs)."""
    if self._cache is not None:
      self._cache.pop(key, None)

  @property
  def source(self) -> str | None:
    """The file the module was read from, if any."""
    return self._ctx.source if self._ctx else None

  @property
  def text(self) -> str | None:
    """The text the module was parsed from."""
    return self._ctx.text if self._ctx else None

  @property
  def entry(self) -> Computation:
    return self._index[self.entry_name]

  @property
  def is_scheduled(self) -> bool:
    return self.attributes.get("is_scheduled") == "true"

  @property
  def entry_computation_layout(self) -> ProgramShape | None:
    raw = self.attributes.get("entry_computation_layout")
    if raw is None:
      return None
    return self._cached("entry_computation_layout",
                        lambda: _attributes.program_shape(raw, self._where(
                            "entry_computation_layout", raw)))

  @property
  def input_output_alias(self) -> tuple[ModuleAlias, ...]:
    raw = self.attributes.get("input_output_alias")
    if raw is None:
      return ()
    return self._cached("input_output_alias",
                        lambda: _attributes.module_aliasing(raw, self._where(
                            "input_output_alias", raw)))

  def _where(self, key: str, raw: str) -> _ModuleWhere:
    return _ModuleWhere(self, key, raw)

  def computation(self, name: str) -> Computation:
    """The computation called `name`.

    Raises:
      KeyError: if there is none.
    """
    try:
      return self._index[name]
    except KeyError:
      raise KeyError(f"no computation {name!r} in module {self.name!r}") from None

  def __contains__(self, name: str) -> bool:
    return name in self._index

  def instructions(self) -> Iterator[tuple[Computation, Instruction]]:
    """Every (computation, instruction) pair, computations in module order."""
    for comp in self.computations:
      for inst in comp.instructions:
        yield comp, inst

  @property
  def instruction_count(self) -> int:
    return sum(len(c.instructions) for c in self.computations)

  def callers(self) -> Mapping[str, tuple[tuple[str, str, str], ...]]:
    """computation name -> ((caller computation, instruction, role), ...)."""
    def decode():
      out: dict[str, list] = {}
      for comp in self.computations:
        for inst in comp.instructions:
          for role, names in inst.called_computations.items():
            for n in names:
              out.setdefault(n, []).append((comp.name, inst.name, role))
      return types.MappingProxyType({k: tuple(v) for k, v in out.items()})
    return self._cached("callers", decode)

  def source_location(self, inst: Instruction) -> SourceLocation | None:
    """The user's source location of `inst`: `source_file`/`source_line` of
    its metadata, else the innermost frame of its `stack_frame_id`."""
    md = inst.metadata
    if md.source_file and md.source_line:
      return SourceLocation(file=md.source_file, line=md.source_line,
                            column=md.source_column)
    if md.stack_frame_id and self.stack_frame_index is not None:
      return self.stack_frame_index.location(md.stack_frame_id)
    return None

  def decode_all(self) -> None:
    """Decodes every typed attribute of every instruction and the header.

    Raises:
      HloParseError: at the first malformed attribute.
    """
    self.entry_computation_layout  # noqa: B018 - decoded for its errors
    self.input_output_alias  # noqa: B018
    for _, inst in self.instructions():
      inst.decode_all()


_TRIVIA = re.compile(r"(?:[ \t\r\n]+|//[^\n\r]*|/\*.*?\*/)*", re.DOTALL)


def _value_offset(text: str, key: str, raw: str, start: int) -> int:
  """Offset of `raw` as the value of attribute `key` at or after `start`, or
  -1. Line breaks and comments may sit between `key=` and the value."""
  probe = key + "="
  at = text.find(probe, start)
  while at >= 0:
    if at == 0 or not (text[at - 1].isalnum() or text[at - 1] in "_.-"):
      v = _TRIVIA.match(text, at + len(probe)).end()
      if text.startswith(raw, v):
        return v
    at = text.find(probe, at + 1)
  return -1


@dataclasses.dataclass(frozen=True, slots=True)
class _ModuleWhere:
  module: HloModule
  key: str
  raw: str

  def offset(self) -> int:
    ctx = self.module._ctx
    if ctx is None:
      return -1
    at = _value_offset(ctx.text, self.key, self.raw, 0)
    return at if at >= 0 else 0

  @property
  def ctx(self) -> TextContext | None:
    return self.module._ctx


"""The HLO IR's value types: shapes and layouts, metadata and source
locations, and the decoded forms of instruction and module attributes.

Frozen, slotted dataclasses that depend on nothing but element types: the
grammar and the attribute decoders build them, and `ir.py` (modules,
computations, instructions) holds them, so the three import this module and
not each other.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator, Mapping
from typing import Any

from hlo_audit._src.hlo import dtypes

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _empty() -> Mapping[str, Any]:
  return _EMPTY


#: Tile dimension printed as `*`: combine the dimension with the next one.
COMBINE_DIMENSION = -(1 << 63)
#: Size recorded for an unbounded dynamic dimension, printed as `?`.
UNBOUNDED = -1


# ----------------------------------------------------------------- shapes ----


@dataclasses.dataclass(frozen=True, slots=True)
class Tile:
  """One tile of a tiled layout, e.g. `T(8,128)`."""

  #: Tile sizes, minor-most last; `COMBINE_DIMENSION` for `*`.
  dims: tuple[int, ...]

  def __str__(self) -> str:
    return "(" + ",".join("*" if d == COMBINE_DIMENSION else str(d)
                          for d in self.dims) + ")"


#: The memory space (`S(n)`) of the device's main memory (HBM); buffers in
#: any other are on chip or on the host, outside the device's footprint.
DEVICE_MEMORY_SPACE = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
  """An array layout, e.g. `{1,0:T(8,128)(2,1)E(4)S(1)}`."""

  #: Dimension numbers from minor-most to major-most.
  minor_to_major: tuple[int, ...]
  #: Tiles, applied in order (`T(8,128)(2,1)`).
  tiles: tuple[Tile, ...] = ()
  #: Sparse dimension level types (`D(D,C)`), as written.
  dim_level_types: tuple[str, ...] = ()
  #: `L(n)`: tail padding alignment in elements.
  tail_padding_alignment: int = 1
  #: `#(u32)`: index primitive type of sparse layouts.
  index_type: str | None = None
  #: `*(u32)`: pointer primitive type of sparse layouts.
  pointer_type: str | None = None
  #: `E(n)`: bits per element when sub-byte elements are packed; 0 if unset.
  element_size_bits: int = 0
  #: `S(n)`: memory space (0 = default device memory; 1 is often on-chip/host).
  memory_space: int = 0
  #: `SC(dim:i,j,...)`: split configs, as (dimension, split indices).
  split_configs: tuple[tuple[int, tuple[int, ...]], ...] = ()
  #: `P(shape)`: physical shape of sparse layouts.
  physical_shape: Shape | None = None
  #: `M(n)`: bytes of dynamic-shape metadata before the data.
  dynamic_metadata_prefix_bytes: int = 0

  def __str__(self) -> str:
    s = ",".join(map(str, self.minor_to_major))
    extra = []
    if self.dim_level_types:
      extra.append("D(" + ",".join(self.dim_level_types) + ")")
    if self.tiles:
      extra.append("T" + "".join(map(str, self.tiles)))
    if self.tail_padding_alignment != 1:
      extra.append(f"L({self.tail_padding_alignment})")
    if self.index_type:
      extra.append(f"#({self.index_type})")
    if self.pointer_type:
      extra.append(f"*({self.pointer_type})")
    if self.element_size_bits:
      extra.append(f"E({self.element_size_bits})")
    if self.memory_space:
      extra.append(f"S({self.memory_space})")
    if self.split_configs:
      extra.append("SC" + "".join(
          f"({d}:{','.join(map(str, idx))})" for d, idx in self.split_configs))
    if self.physical_shape is not None:
      extra.append(f"P({self.physical_shape})")
    if self.dynamic_metadata_prefix_bytes:
      extra.append(f"M({self.dynamic_metadata_prefix_bytes})")
    if extra:
      s += ":" + "".join(extra)
    return "{" + s + "}"


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
  """An HLO shape: an array, a tuple, a token or an opaque value.

  Byte sizes are computed here and nowhere else (`byte_size`,
  `physical_byte_size`).
  """

  #: Element type name ("f32", "bf16", "s4", "pred", "token", "opaque"), or
  #: "tuple" for tuples.
  element_type: str
  #: Dimension sizes; a bounded dynamic dimension (`<=N`) records N, an
  #: unbounded one (`?`) records `UNBOUNDED`.
  dims: tuple[int, ...] = ()
  #: Per dimension, whether it is dynamic; empty when none is.
  dynamic_dims: tuple[bool, ...] = ()
  #: Element shapes of a tuple.
  tuple_shapes: tuple[Shape, ...] = ()
  #: Layout, or None when the text gives none.
  layout: Layout | None = None
  #: Whether the shape is a buffer, written `b(shape)`.
  is_buffer: bool = False

  @property
  def is_tuple(self) -> bool:
    return self.element_type == "tuple"

  @property
  def is_array(self) -> bool:
    """True for arrays (rank 0 included); False for tuples, tokens, opaque."""
    return self.element_type not in ("tuple", "token", "opaque")

  @property
  def rank(self) -> int:
    return len(self.dims)

  @property
  def num_elements(self) -> int:
    """Elements of an array (bounds for dynamic dims; 0 if one is unbounded)."""
    n = 1
    for d in self.dims:
      if d < 0:
        return 0
      n *= d
    return n

  @property
  def is_dynamic(self) -> bool:
    return any(self.dynamic_dims)

  @property
  def byte_size(self) -> int:
    """Dense bytes of the data: arrays by element storage width (sub-byte
    types packed only when the layout says `E(n)`), tuples the sum of their
    elements, tokens and opaque values 0."""
    if self.element_type == "tuple":
      return sum(s.byte_size for s in self.tuple_shapes)
    if self.element_type in ("token", "opaque"):
      return 0
    esize = self.layout.element_size_bits if self.layout is not None else 0
    bits = dtypes.storage_bits_of(self.element_type, esize)
    return (self.num_elements * bits + 7) // 8

  @property
  def physical_byte_size(self) -> int:
    """Bytes with the first tile's padding applied (TPU `T(8,128)` layouts
    pad the minor dimensions up to tile multiples); equals `byte_size` for
    untiled layouts."""
    if self.element_type == "tuple":
      return sum(s.physical_byte_size for s in self.tuple_shapes)
    layout = self.layout
    if layout is None or not layout.tiles or not self.is_array:
      return self.byte_size
    tile = layout.tiles[0].dims
    if any(t == COMBINE_DIMENSION or t <= 0 for t in tile):
      return self.byte_size
    # Tiles apply to the most-minor dimensions in physical (major-to-minor)
    # order; a scalar is tiled as one element (`f32[]{:T(128)}`: 512 bytes).
    physical = [self.dims[d] for d in reversed(layout.minor_to_major)] if self.dims else [1]
    if any(d < 0 for d in physical):
      return self.byte_size
    for i, t in enumerate(reversed(tile)):
      j = len(physical) - 1 - i
      if j < 0:
        break
      physical[j] = -(-physical[j] // t) * t
    n = 1
    for d in physical:
      n *= d
    bits = dtypes.storage_bits_of(self.element_type, layout.element_size_bits)
    return (n * bits + 7) // 8

  @property
  def memory_space(self) -> int:
    """The layout's `S(n)`: 0 is the device's main memory (HBM); XLA:TPU
    stages data on chip in others (1 VMEM, 2 semaphores and scalars, 3 v4's
    CMEM) and host offloading writes 5 (`DEVICE_MEMORY_SPACE`)."""
    return self.layout.memory_space if self.layout is not None else 0

  @property
  def device_byte_size(self) -> int:
    """Bytes this shape takes in the device's main memory: the tiled
    (`physical_byte_size`) bytes of leaves in memory space 0, nothing for
    leaves XLA placed elsewhere (on chip, on the host). The footprint XLA
    reports counts these; for untiled layouts in space 0 it is `byte_size`."""
    if self.element_type == "tuple":
      return sum(s.device_byte_size for s in self.tuple_shapes)
    if self.memory_space != DEVICE_MEMORY_SPACE:
      return 0
    return self.physical_byte_size

  def leaves(self, index: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Shape]]:
    """(shape index, shape) of every non-tuple leaf, depth first."""
    if self.element_type == "tuple":
      for i, s in enumerate(self.tuple_shapes):
        yield from s.leaves(index + (i,))
    else:
      yield index, self

  def subshape(self, index: tuple[int, ...]) -> Shape:
    """The shape at `index` of a (nested) tuple shape.

    Raises:
      IndexError: if `index` does not exist in this shape.
    """
    s = self
    for i in index:
      if s.element_type != "tuple" or not 0 <= i < len(s.tuple_shapes):
        raise IndexError(f"shape index {index} not in {self}")
      s = s.tuple_shapes[i]
    return s

  def __str__(self) -> str:
    if self.element_type == "tuple":
      body = "(" + ", ".join(map(str, self.tuple_shapes)) + ")"
    else:
      if self.element_type in ("token", "opaque") and not self.dims:
        body = f"{self.element_type}[]"
      else:
        dims = []
        for i, d in enumerate(self.dims):
          dyn = self.dynamic_dims[i] if self.dynamic_dims else False
          dims.append("?" if d == UNBOUNDED else (f"<={d}" if dyn else str(d)))
        body = f"{self.element_type}[{','.join(dims)}]"
      if self.layout is not None:
        body += str(self.layout)
    return f"b({body})" if self.is_buffer else body

  @property
  def dtype_str(self) -> str:
    """Element type and dims without layout, e.g. "f32[128,512]"."""
    if self.element_type == "tuple":
      return "(" + ", ".join(s.dtype_str for s in self.tuple_shapes) + ")"
    return f"{self.element_type}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramShape:
  """Parameter and result shapes, as in `entry_computation_layout`."""

  parameters: tuple[Shape, ...]
  result: Shape


# --------------------------------------------------------------- metadata ----


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLocation:
  """A place in the user's source code."""

  file: str
  line: int
  column: int = 0
  function: str = ""

  def __str__(self) -> str:
    return f"{self.file}:{self.line}"


@dataclasses.dataclass(frozen=True, slots=True)
class Metadata:
  """An instruction's `metadata={...}`."""

  op_type: str = ""
  #: The JAX name stack, e.g. "jit(f)/jvp(gelu)/mul".
  op_name: str = ""
  source_file: str = ""
  source_line: int = 0
  source_end_line: int = 0
  source_column: int = 0
  source_end_column: int = 0
  #: 1-based index into the module's StackFrames table; 0 when absent.
  stack_frame_id: int = 0
  deduplicated_name: str = ""
  scheduling_name: str = ""
  profile_type: tuple[int, ...] = ()
  #: Keys this version of hlo_audit does not know, kept raw (newer XLA).
  extra: Mapping[str, str] = dataclasses.field(default_factory=_empty)


@dataclasses.dataclass(frozen=True, slots=True)
class FileLocation:
  """A row of the module's FileLocations table (ids are 1-based)."""

  file_name_id: int
  function_name_id: int
  line: int
  end_line: int
  column: int
  end_column: int


@dataclasses.dataclass(frozen=True, slots=True)
class StackFrame:
  """A row of the module's StackFrames table.

  `parent_frame_id` is the 1-based id of the caller's frame, 0 for none (the
  text prints it one higher, as XLA does).
  """

  file_location_id: int
  parent_frame_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class StackFrameIndex:
  """The FileNames/FunctionNames/FileLocations/StackFrames tables."""

  file_names: tuple[str, ...]
  function_names: tuple[str, ...]
  file_locations: tuple[FileLocation, ...]
  stack_frames: tuple[StackFrame, ...]
  _stacks: dict | None = dataclasses.field(
      default=None, compare=False, repr=False, init=False)

  def location(self, frame_id: int) -> SourceLocation | None:
    """The source location of frame `frame_id` (1-based), or None."""
    if not 1 <= frame_id <= len(self.stack_frames):
      return None
    frame = self.stack_frames[frame_id - 1]
    if not 1 <= frame.file_location_id <= len(self.file_locations):
      return None
    loc = self.file_locations[frame.file_location_id - 1]
    file = (self.file_names[loc.file_name_id - 1]
            if 1 <= loc.file_name_id <= len(self.file_names) else "")
    func = (self.function_names[loc.function_name_id - 1]
            if 1 <= loc.function_name_id <= len(self.function_names) else "")
    return SourceLocation(file=file, line=loc.line, column=loc.column,
                          function=func)

  def stack(self, frame_id: int) -> tuple[SourceLocation, ...]:
    """Locations from frame `frame_id` outwards to the outermost caller
    (memoized: thousands of instructions share a few hundred frames, and an
    audit keeps a stack per instruction it attributes)."""
    stacks = self._stacks
    if stacks is None:
      stacks = {}
      object.__setattr__(self, "_stacks", stacks)
    hit = stacks.get(frame_id)
    if hit is None:
      out = []
      seen = set()
      frame = frame_id
      while frame and frame not in seen:
        seen.add(frame)
        loc = self.location(frame)
        if loc is None:
          break
        out.append(loc)
        frame = self.stack_frames[frame - 1].parent_frame_id
      hit = stacks[frame_id] = tuple(out)
    return hit


# ------------------------------------------------------ attribute values ----


@dataclasses.dataclass(frozen=True, slots=True)
class SliceDim:
  """One dimension of `slice={[start:limit:stride], ...}`."""

  start: int
  limit: int
  stride: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class WindowDim:
  """One dimension of a convolution or reduce-window `window={...}`."""

  size: int = 1
  stride: int = 1
  padding_low: int = 0
  padding_high: int = 0
  window_dilation: int = 1
  base_dilation: int = 1
  window_reversal: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class PaddingDim:
  """One dimension of a pad's `padding=low_high_interior`."""

  low: int
  high: int
  interior: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class DotDimensionNumbers:
  """`lhs_batch_dims`, `rhs_batch_dims`, `lhs_contracting_dims`, ... of a dot."""

  lhs_batch: tuple[int, ...] = ()
  rhs_batch: tuple[int, ...] = ()
  lhs_contracting: tuple[int, ...] = ()
  rhs_contracting: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ConvDimensionNumbers:
  """A convolution's `dim_labels`, e.g. `b01f_01io->b01f`."""

  #: The labels as written.
  labels: str
  input_batch: int
  input_feature: int
  input_spatial: tuple[int, ...]
  kernel_input_feature: int
  kernel_output_feature: int
  kernel_spatial: tuple[int, ...]
  output_batch: int
  output_feature: int
  output_spatial: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class OutputOperandAlias:
  """One entry of `output_to_operand_aliasing={{out}: (operand, {index})}`."""

  output_index: tuple[int, ...]
  operand: int
  operand_index: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleAlias:
  """One entry of the module's `input_output_alias={ {out}: (param, {index}, kind) }`."""

  output_index: tuple[int, ...]
  parameter: int
  parameter_index: tuple[int, ...]
  must_alias: bool = False


# ------------------------------------------------------------------- nodes ----


@dataclasses.dataclass(frozen=True, slots=True)
class TextContext:
  """The text a module was parsed from; decoders point their errors into it."""

  text: str
  source: str | None = None
  #: Computation renames XLA's name uniquifier made (old -> new).
  computation_renames: Mapping[str, str] = dataclasses.field(default_factory=_empty)

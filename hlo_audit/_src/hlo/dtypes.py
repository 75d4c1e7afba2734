"""Element types of HLO shapes: the one table of their names, widths and kinds.

Every byte count in hlo_audit comes from `bits_of` here, so a new XLA type
needs one new row and nothing else.
"""

from __future__ import annotations

import enum
import types


class Kind(enum.Enum):
  """What an element type holds."""

  PRED = "pred"
  SIGNED = "signed"
  UNSIGNED = "unsigned"
  FLOAT = "float"
  COMPLEX = "complex"
  #: `token`, `opaque`: values with no bytes of data.
  NONE = "none"


#: name -> (bits per element, kind). Names as XLA prints them.
_TABLE: dict[str, tuple[int, Kind]] = {
    "pred": (8, Kind.PRED),
    "s1": (1, Kind.SIGNED),
    "s2": (2, Kind.SIGNED),
    "s4": (4, Kind.SIGNED),
    "s8": (8, Kind.SIGNED),
    "s16": (16, Kind.SIGNED),
    "s32": (32, Kind.SIGNED),
    "s64": (64, Kind.SIGNED),
    "u1": (1, Kind.UNSIGNED),
    "u2": (2, Kind.UNSIGNED),
    "u4": (4, Kind.UNSIGNED),
    "u8": (8, Kind.UNSIGNED),
    "u16": (16, Kind.UNSIGNED),
    "u32": (32, Kind.UNSIGNED),
    "u64": (64, Kind.UNSIGNED),
    "f4e2m1fn": (4, Kind.FLOAT),
    "f8e3m4": (8, Kind.FLOAT),
    "f8e4m3": (8, Kind.FLOAT),
    "f8e4m3fn": (8, Kind.FLOAT),
    "f8e4m3b11fnuz": (8, Kind.FLOAT),
    "f8e4m3fnuz": (8, Kind.FLOAT),
    "f8e5m2": (8, Kind.FLOAT),
    "f8e5m2fnuz": (8, Kind.FLOAT),
    "f8e8m0fnu": (8, Kind.FLOAT),
    "f16": (16, Kind.FLOAT),
    "bf16": (16, Kind.FLOAT),
    "f32": (32, Kind.FLOAT),
    "f64": (64, Kind.FLOAT),
    "c64": (64, Kind.COMPLEX),
    "c128": (128, Kind.COMPLEX),
    "token": (0, Kind.NONE),
    "opaque": (0, Kind.NONE),
}

#: Element type names the HLO lexer treats as reserved words.
ELEMENT_TYPES = frozenset(_TABLE)

#: XLA's `PrimitiveType` numbers (xla/xla_data.proto) -> element type name:
#: XLA's GPU specs key their per-type unit rates by these numbers.
PRIMITIVE_TYPES = types.MappingProxyType({
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16",
    8: "u32", 9: "u64", 10: "f16", 11: "f32", 12: "f64", 15: "c64", 16: "bf16",
    18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 30: "s1", 31: "u1", 32: "f4e2m1fn",
    33: "f8e8m0fnu",
})

#: name -> numpy dtype name, for the types numpy (with ml_dtypes) knows.
NUMPY_NAMES = types.MappingProxyType({
    "pred": "bool", "s4": "int4", "s8": "int8", "s16": "int16", "s32": "int32",
    "s64": "int64", "u4": "uint4", "u8": "uint8", "u16": "uint16",
    "u32": "uint32", "u64": "uint64", "f16": "float16", "bf16": "bfloat16",
    "f32": "float32", "f64": "float64", "c64": "complex64",
    "c128": "complex128", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
    "f8e4m3": "float8_e4m3", "f8e3m4": "float8_e3m4",
    "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2fnuz": "float8_e5m2fnuz",
    "f8e4m3b11fnuz": "float8_e4m3b11fnuz", "f4e2m1fn": "float4_e2m1fn",
    "f8e8m0fnu": "float8_e8m0fnu",
})


def is_element_type(name: str) -> bool:
  """Whether `name` is an XLA element type such as "f32" or "f8e4m3fn"."""
  return name in _TABLE


def bits_of(name: str) -> int:
  """Bits of one element of type `name` (0 for token and opaque).

  Raises:
    KeyError: for a name that is not an element type.
  """
  return _TABLE[name][0]


def storage_bits_of(name: str, element_size_bits: int = 0) -> int:
  """Bits one element occupies in memory.

  XLA stores sub-byte types one per byte unless the layout packs them with an
  explicit element size (`E(4)` in `{1,0:E(4)}`), which `element_size_bits`
  carries; `pred` always takes a byte.
  """
  if element_size_bits:
    return element_size_bits
  bits = _TABLE[name][0]
  return 8 if 0 < bits < 8 else bits


def kind_of(name: str) -> Kind:
  """The `Kind` of element type `name`."""
  return _TABLE[name][1]


def is_floating(name: str) -> bool:
  """Whether `name` is a real floating-point type (any width)."""
  return _TABLE[name][1] is Kind.FLOAT


def is_integral(name: str) -> bool:
  """Whether `name` is a signed or unsigned integer type."""
  return _TABLE[name][1] in (Kind.SIGNED, Kind.UNSIGNED)


def to_numpy(name: str) -> str:
  """The numpy/JAX dtype name of XLA element type `name` ("bf16" ->
  "bfloat16"); `name` itself when numpy has no such type."""
  return NUMPY_NAMES.get(name, name)


def from_numpy(dtype) -> str:
  """The XLA name of a numpy/JAX dtype, e.g. float32 -> "f32"."""
  name = getattr(dtype, "name", str(dtype))
  for xla, np_name in NUMPY_NAMES.items():
    if np_name == name:
      return xla
  raise KeyError(f"no XLA element type for dtype {name!r}")


#: Floating types' (exponent bits, mantissa bits): what a conversion keeps.
_FLOAT_FORMAT = {
    "f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52),
    "f8e4m3fn": (4, 3), "f8e4m3": (4, 3), "f8e4m3fnuz": (4, 3),
    "f8e4m3b11fnuz": (4, 3), "f8e5m2": (5, 2), "f8e5m2fnuz": (5, 2),
    "f8e3m4": (3, 4), "f4e2m1fn": (2, 1), "f8e8m0fnu": (8, 0),
}


def is_widening(src: str, dst: str) -> bool:
  """Whether converting `src` to `dst` represents every `src` value exactly
  (bf16 -> f32 yes; f32 -> bf16 and f16 <-> bf16 no; s8 -> s32 yes)."""
  if src == dst:
    return True
  if is_floating(src) and is_floating(dst):
    a, b = _FLOAT_FORMAT.get(src), _FLOAT_FORMAT.get(dst)
    # Two types of one width differ in bias, infinities or NaN encodings
    # (f8e4m3fn's 448 is past f8e4m3fnuz's 240; f8e5m2's inf is not in
    # f8e5m2fnuz): neither holds the other.
    return (a is not None and b is not None and a != b
            and a[0] <= b[0] and a[1] <= b[1])
  if is_integral(src) and is_integral(dst):
    ks, kd = kind_of(src), kind_of(dst)
    bs, bd = bits_of(src), bits_of(dst)
    if ks is kd:
      return bs <= bd
    return ks is Kind.UNSIGNED and bs < bd  # u8 -> s16 fits; s8 -> u16 does not
  if is_integral(src) and is_floating(dst):
    fmt = _FLOAT_FORMAT.get(dst)
    return fmt is not None and bits_of(src) <= fmt[1] + 1
  return src == "pred"

"""GPU specs: the `GpuTargetConfigProto` texts XLA:GPU compiles for, by name.

A spec is what XLA knows of a GPU without seeing it: SM count, shared memory,
registers, HBM size and bandwidth, clocks, compute capability and the
per-unit rates its cost models read (XLA's
`xla/backends/gpu/target_config/specs/*.txtpb`). This module alone knows
them. A name resolves, first found wins:

1. in the installed CUDA plugin: `xla_cuda_plugin.so` of jax-cuda12-pjrt
   0.12 and newer embeds XLA's specs as text, each found by its
   `device_description_str`; they match that XLA exactly;
2. in the copies shipped with hlo-audit (`specs/*.txtpb`, written by
   `extract_specs.py` from jax-cuda12-pjrt 0.12.0.1's plugin,
   Apache-2.0 headers kept), for plugins that embed none (0.11.2 and 0.10.2,
   whose XLA reads the same text: `compat.GPU_SPEC_FIELDS_UNKNOWN`).

A path to a `GpuTargetConfigProto` text file is a spec too (a GPU XLA ships
none for, or one dumped on the machine: `nvidia-smi` is not needed).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import mmap
import os
import pathlib
import re

from hlo_audit._src import compat
from hlo_audit._src.errors import TargetError

#: Where the shipped copies live.
BUNDLED_DIR = pathlib.Path(__file__).resolve().parent / "specs"
#: The jax-cuda12-pjrt whose plugin the shipped copies were extracted from.
BUNDLED_FROM = "jax-cuda12-pjrt 0.12.0.1"

#: XLA's device description -> our name: XLA's spec file name
#: (xla/backends/gpu/target_config/specs/<name>.txtpb), '_' written '-'.
_NAMES = {
    "NVIDIA H200 141GB HBM3e": "h200",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb": "h100-sxm-mig",
    "NVIDIA B200": "b200",
    "NVIDIA B200 MIG 1g.23gb": "b200-mig",
    "NVIDIA B300": "b300",
    "NVIDIA GB200": "gb200",
    "NVIDIA GB300": "gb300",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80",
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80",
    "NVIDIA RTX A6000": "a6000",
    "NVIDIA RTX PRO 6000 Blackwell": "rtx6000pro",
    "Tesla V100-SXM2-16GB": "v100",
    "Tesla P100-SXM2-16GB": "p100",
}
#: Short names people use for a family -> the spec they mean.
ALIASES = {"h100": "h100-sxm", "a100": "a100-sxm-80"}

_DESCRIPTION = re.compile(rb'\ndevice_description_str: "([^"\n]*)"')


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSpec:
  """One GPU XLA can compile for, and where its spec came from."""

  #: Our name, e.g. "h200" (or the file's path for a spec read from a file).
  name: str
  #: What XLA calls the device (`device_description_str`), e.g.
  #: "NVIDIA H200 141GB HBM3e"; jax's `device_kind`.
  device_kind: str
  #: e.g. "9.0"; "" when the spec names none (not a CUDA GPU).
  compute_capability: str
  #: Streaming multiprocessors.
  core_count: int
  #: Device memory.
  memory_bytes: int
  #: Where the text came from: the plugin ("jax-cuda12-pjrt 0.12.0.1"),
  #: hlo-audit's copy, or a file's path.
  source: str
  #: The `GpuTargetConfigProto` text.
  text: str = dataclasses.field(repr=False, compare=False)

  @property
  def is_cuda(self) -> bool:
    return bool(self.compute_capability)


def normalize(name: str) -> str:
  """"H100_SXM" -> "h100-sxm"; an alias -> the name it stands for."""
  key = name.strip().lower().replace("_", "-")
  return ALIASES.get(key, key)


def name_for(device_kind: str) -> str:
  """Our name for a device description; unknown ones get a slug
  ("NVIDIA VR NVL72" -> "vr-nvl72")."""
  known = _NAMES.get(device_kind)
  if known:
    return known
  slug = re.sub(r"^(nvidia|tesla)\s+", "", device_kind.strip().lower())
  return re.sub(r"[^a-z0-9]+", "-", slug).strip("-")


def parse_spec(text: str, *, source: str, name: str | None = None) -> GpuSpec:
  """A spec from `GpuTargetConfigProto` text.

  Raises:
    TargetError: when the text is not a GPU spec (no `gpu_device_info`).
  """
  if not re.search(r"(?m)^\s*gpu_device_info\s*[{<:]", text):
    raise TargetError(f"{source}: not a GpuTargetConfigProto text (no gpu_device_info)")
  m = re.search(r'device_description_str:\s*"([^"]*)"', text)
  kind = m.group(1) if m else ""
  cc = re.search(r"cuda_compute_capability\s*\{([^}]*)\}", text)
  capability = ""
  if cc:
    major = re.search(r"major:\s*(\d+)", cc.group(1))
    minor = re.search(r"minor:\s*(\d+)", cc.group(1))
    capability = f"{major.group(1) if major else 0}.{minor.group(1) if minor else 0}"

  def number(field: str) -> int:
    found = re.search(rf"\b{field}:\s*(\d+)", text)
    return int(found.group(1)) if found else 0

  return GpuSpec(name=name or name_for(kind) or source, device_kind=kind,
                 compute_capability=capability, core_count=number("core_count"),
                 memory_bytes=number("device_memory_size"), source=source, text=text)


# Protobuf's text format, as far as telling well-formed from not: comments,
# strings (adjacent ones concatenate), numbers, identifiers, punctuation.
_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?))
  | (?P<ident>-?[A-Za-z_][\w]*)
  | (?P<punct>[{}<>\[\]:,;/.])
""", re.VERBOSE)


_WORDS = {"ident": "a name", "number": "a number", "string": "a string"}


def check_text_proto(text: str, source: str) -> None:
  """Checks that `text` is well-formed protobuf text format (fields
  `name: value`, `name { ... }`, `name: [ ... ]`, `[extension.name]`).

  XLA would otherwise reject a malformed spec only when it compiles, with
  no line to point at; a well-formed text of the wrong message is caught by
  `parse_spec`'s field checks.

  Raises:
    TargetError: `source:line:col: what was expected, and the text there`.
  """
  tokens = []  # (kind, text, offset)
  pos = 0
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if m is None:
      _syntax(text, source, pos, "unexpected character")
    if m.lastgroup != "space":
      tokens.append((m.lastgroup, m.group(), pos))
    pos = m.end()
  tokens.append(("end", "", len(text)))
  i = 0

  def peek() -> tuple[str, str, int]:
    return tokens[i]

  def take(*want: str) -> tuple[str, str, int]:
    nonlocal i
    tok = tokens[i]
    if tok[1] not in want and tok[0] not in want:
      _syntax(text, source, tok[2], "expected " + " or ".join(_WORDS.get(w, repr(w))
                                                              for w in want))
    i += 1
    return tok

  def value() -> None:
    kind, tok, _ = peek()
    if tok in ("{", "<"):
      take(tok)
      fields("}" if tok == "{" else ">")
    elif kind == "string":
      while peek()[0] == "string":
        take("string")
    else:
      take("number", "ident", "string")

  def fields(close: str) -> None:
    while peek()[1] != close:
      if peek()[0] == "end":
        _syntax(text, source, peek()[2], f"expected a field or {close!r}")
      if peek()[1] == "[":  # an extension or Any type name
        take("[")
        take("ident")
        while peek()[1] in (".", "/"):
          take(peek()[1])
          take("ident")
        take("]")
      else:
        take("ident")
      if peek()[1] == ":":
        take(":")
        if peek()[1] == "[":
          take("[")
          while peek()[1] != "]":
            value()
            if peek()[1] != "]":
              take(",")
          take("]")
        else:
          value()
      elif peek()[1] in ("{", "<"):
        value()
      else:
        take(":", "{")
      if peek()[1] in (",", ";"):
        take(peek()[1])
    take(close)

  fields("")


def _syntax(text: str, source: str, pos: int, what: str):
  line = text.count("\n", 0, pos) + 1
  col = pos - (text.rfind("\n", 0, pos) + 1) + 1
  here = text[pos:].split("\n", 1)[0][:40] if pos < len(text) else "end of file"
  raise TargetError(f"{source}:{line}:{col}: malformed GpuTargetConfigProto text: {what}, "
                    f"found {here!r}")


# ------------------------------------------------------------- sources ----


def plugin_library() -> tuple[str, str] | None:
  """(path of the installed CUDA plugin's `xla_cuda_plugin.so`, the version
  of the wheel holding it), without importing the plugin; None when absent."""
  try:
    found = importlib.util.find_spec("jax_plugins")
  except (ImportError, ValueError):
    return None
  if found is None or not found.submodule_search_locations:
    return None
  for root in found.submodule_search_locations:
    for sub in sorted(pathlib.Path(root).glob("xla_cuda*/xla_cuda_plugin.so")):
      cuda = sub.parent.name.removeprefix("xla_")  # "cuda12"
      dist = f"jax-{cuda}-pjrt"
      try:
        version = importlib.metadata.version(dist)
      except importlib.metadata.PackageNotFoundError:
        version = "?"
      return str(sub), f"{dist} {version}"
  return None


def plugin_specs() -> tuple[GpuSpec, ...]:
  """The CUDA specs the installed plugin embeds (none before 0.12)."""
  found = plugin_library()
  if found is None:
    return ()
  path, source = found
  st = os.stat(path)
  return _scan(path, st.st_size, st.st_mtime_ns, source)


@functools.cache
def _scan(path: str, size: int, mtime: int, source: str) -> tuple[GpuSpec, ...]:
  """Every spec text in the plugin binary: NUL-terminated strings holding a
  `device_description_str` line (a fifth of a second for its 480 MB)."""
  del size, mtime  # the cache key: a reinstalled plugin is scanned again
  out: dict[str, GpuSpec] = {}
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
    pos = 0
    while True:
      i = mm.find(b'\ndevice_description_str: "', pos)
      if i < 0:
        break
      start = mm.rfind(b"\0", 0, i) + 1
      end = mm.find(b"\0", i)
      end = len(mm) if end < 0 else end
      pos = end
      blob = mm[start:end]
      if b"gpu_device_info" not in blob:
        continue
      try:
        spec = parse_spec(blob.decode("utf-8"), source=source)
      except (UnicodeDecodeError, TargetError):
        continue
      if spec.is_cuda:  # the ROCm and SYCL specs need another plugin
        out.setdefault(spec.name, spec)
  return tuple(out.values())


@functools.cache
def bundled_specs() -> tuple[GpuSpec, ...]:
  """The copies shipped with hlo-audit."""
  source = f"hlo-audit's copy of XLA's spec (from {BUNDLED_FROM})"
  return tuple(parse_spec(p.read_text(encoding="utf-8"), source=source, name=p.stem)
               for p in sorted(BUNDLED_DIR.glob("*.txtpb")))


def known_specs() -> tuple[GpuSpec, ...]:
  """Every spec a name can pick: the plugin's, then the shipped copies of
  the others, by name."""
  out = {s.name: s for s in bundled_specs()}
  out.update({s.name: s for s in plugin_specs()})
  return tuple(sorted(out.values(), key=lambda s: s.name))


def find_spec(name: str | os.PathLike) -> GpuSpec:
  """The spec a target name or a spec file's path picks.

  Raises:
    TargetError: for an unknown name (the message lists the known ones), or
      a file that cannot be read or is not a spec.
  """
  text = os.fspath(name)
  if os.sep in text or text.endswith((".txtpb", ".pbtxt", ".textproto", ".txt")) or \
      os.path.isfile(text):
    try:
      raw = pathlib.Path(text).read_bytes()
    except OSError as e:
      raise TargetError(f"target {text!r}: cannot read the spec file: "
                        f"{e.strerror or e}") from None
    try:
      content = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      line = raw.count(b"\n", 0, e.start) + 1
      raise TargetError(f"target {text!r}: not a GpuTargetConfigProto text file: byte "
                        f"0x{raw[e.start]:02x} on line {line} is not UTF-8") from None
    spec = parse_spec(content, source=text, name=text)  # (is it a spec at all?)
    check_text_proto(content, text)
    return spec
  key = normalize(text)
  for spec in (*plugin_specs(), *bundled_specs()):
    if spec.name == key:
      return spec
  names = sorted({s.name for s in known_specs()} | set(ALIASES))
  raise TargetError(f"unknown target {text!r}: known are {', '.join(names)}, or a "
                    "path to a GpuTargetConfigProto text file")


def for_installed_xla(spec: GpuSpec) -> str:
  """The spec's text as the installed jaxlib's XLA parses it: fields its
  `GpuDeviceInfoProto` lacks are dropped (`compat.GPU_SPEC_FIELDS_UNKNOWN`)."""
  text = spec.text
  for field in compat.GPU_SPEC_FIELDS_UNKNOWN:
    text = re.sub(rf"(?m)^\s*{field}:[^\n]*\n?", "", text)
  return text

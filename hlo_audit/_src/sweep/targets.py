"""What a sweep audits: the built-in example, MODULE:FUNCTION, or a kernel
library's op (`KernelLibrary.sweep_targets`).

A `Target` names the parameters a grid may set, turns a grid point into its
full parameter set (`resolve`: defaults filled in, values checked and made
canonical, so `dtype=f32` and `dtype=float32` are one point), and measures a
point (`run`): compile, audit, and for kernels optionally validate and time.
`resolve` runs in the parent up front, so a typo in the grid stops the sweep
before anything compiles; `run` runs in a worker, and its errors are recorded
against the point.

Argument templates of MODULE:FUNCTION targets (`--args`):

    x=f32[{b},{d}];w={dtype}[{d},{4*d}];s32[]

are `;`-separated positional arguments, each an HLO shape (`f32[8,128]`;
`f32[]` for a scalar) with an optional `label=` in front (for readers; the
arguments are passed by position). `{...}` is replaced by a grid value: a
name (`{b}`, `{dtype}`, where a dtype may be spelled `f32` or `float32`) or an
integer expression of names with + - * // and parentheses (`{4*d}`). Grid
names the template does not use are passed to the function as keyword
arguments with their Python values (the function is re-jitted with them bound,
so they act as static arguments); the function must accept them.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import functools
import hashlib
import inspect
import operator
import re
import time
from collections.abc import Mapping
from typing import Any

from hlo_audit._src.hlo import dtypes as hlo_dtypes
from hlo_audit._src.report.safe import printable
from hlo_audit._src.sweep.grid import GridError, Value


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
  """One parameter a grid may set."""

  name: str
  #: "int", "float", "bool", "str" or "dtype" (a dtype name, made canonical).
  kind: str
  default: Value
  #: Whether `none` is a valid value.
  optional: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Measure:
  """What to measure at each point besides the audit (kernel targets only)."""

  #: Check the kernel against its float32 reference (the library's validation).
  validate: bool = False
  #: Time the kernel against XLA (the library's benchmark).
  time: bool = False
  #: Timed calls per implementation (median reported).
  repeats: int = 10
  #: Untimed calls first (compilation included).
  warmup: int = 2
  #: Seed of the random inputs.
  seed: int = 0
  #: Compile each point for this GPU ("h200", a spec file) instead of this
  #: machine; None: this machine's backend.
  device: str | None = None
  #: With `device`: a topology of this many GPUs.
  gpus: int | None = None

  @property
  def identity(self) -> dict[str, Any]:
    """What changes a point's results, for its id."""
    out: dict[str, Any] = {"validate": self.validate, "time": self.time}
    if self.validate or self.time:
      out["seed"] = self.seed
    if self.time:
      out.update(repeats=self.repeats, warmup=self.warmup)
    if self.device is not None:  # (absent otherwise: earlier ids stay valid)
      out.update(device=self.device, gpus=self.gpus or 1)
    return out

  def compile_target(self):
    """The `hlo_audit.Target` points compile for, or None.

    Raises:
      GridError: when validation or timing is asked too (they run here).
    """
    if self.device is None:
      return None
    if self.validate or self.time:
      raise GridError("validate/time run the kernel on this machine: not with a GPU target")
    from hlo_audit._src.target.target import get_target
    return get_target(self.device, gpus=self.gpus)


@dataclasses.dataclass(frozen=True, slots=True)
class TargetRef:
  """A picklable description of a target, rebuilt by `make_target` in workers."""

  #: The `--target` text: "example", a kernel name, or MODULE:FUNCTION.
  text: str
  #: The `--args` template (MODULE:FUNCTION only).
  args: str | None = None


class Target(abc.ABC):
  """A thing to compile and audit at each grid point."""

  def __init__(self, ref: TargetRef):
    self.ref = ref

  @property
  @abc.abstractmethod
  def params(self) -> tuple[Param, ...]:
    """The parameters a grid may set."""

  def resolve(self, values: Mapping[str, Value]) -> dict[str, Value]:
    """The point's full, canonical parameters (defaults filled in).

    Raises:
      GridError: for a name this target does not know or a value of the wrong
        type.
    """
    known = {p.name: p for p in self.params}
    for name in values:
      if name not in known:
        raise GridError(f"grid name {name!r} is not a parameter of target "
                        f"{self.ref.text!r}; known: {', '.join(known)}")
    return {p.name: coerce(p, values[p.name], self.ref.text) if p.name in values
            else p.default for p in self.params}

  def identity(self, params: Mapping[str, Value]) -> dict[str, Any]:
    """What determines the compiled program (hashed into the point id)."""
    return {"target": self.ref.text, "params": dict(params)}

  @abc.abstractmethod
  def run(self, params: Mapping[str, Value], measure: Measure,
          html_path: str | None = None) -> dict[str, Any]:
    """Compiles and audits one point; returns the record's measurements.

    Raises:
      Exception: anything the point's compilation or checks raise; the runner
        records it against the point.
    """


def make_target(ref: TargetRef) -> Target:
  """The target `ref` names.

  Raises:
    GridError: for an unknown target, a bad `--args` template, or a
      MODULE:FUNCTION that cannot be imported.
  """
  if ref.text == "example":
    if ref.args:
      raise GridError("--args applies to MODULE:FUNCTION targets, not 'example'")
    return ExampleTarget(ref)
  if ":" in ref.text:
    return FunctionTarget(ref)
  kernels = kernel_targets()
  if ref.text in kernels:
    if ref.args:
      raise GridError(f"--args applies to MODULE:FUNCTION targets, not {ref.text!r}")
    return KernelTarget(ref, kernels[ref.text])
  names = [n for n in kernels if "." not in n]
  raise GridError(f"--target {ref.text!r}: expected 'example', MODULE:FUNCTION, or "
                  "a kernel name (" + (", ".join(names) if names else
                                       "none: no kernel library is installed") + ")")


# ------------------------------------------------------------ values ----


def canonical_dtype(value: str) -> str:
  """'f32', 'float32' -> 'float32'; 'bf16' -> 'bfloat16'.

  Raises:
    GridError: for a name that is neither an XLA element type nor a dtype.
  """
  if value in hlo_dtypes.NUMPY_NAMES:
    return hlo_dtypes.NUMPY_NAMES[value]
  if value in hlo_dtypes.NUMPY_NAMES.values():
    return value
  raise GridError(f"{value!r} is not a dtype (e.g. f32, bf16, float32, bfloat16)")


def coerce(p: Param, value: Value, target: str) -> Value:
  """`value` as parameter `p` takes it.

  Raises:
    GridError: naming the parameter, the value and the expected kind.
  """
  where = f"grid value {p.name}={value!r} (target {target!r})"
  if value is None:
    if p.optional:
      return None
    raise GridError(f"{where}: {p.name} cannot be none")
  if p.kind == "bool":
    if isinstance(value, bool):
      return value
    if isinstance(value, int) and value in (0, 1):
      return bool(value)
    raise GridError(f"{where}: expected true or false")
  if p.kind == "int":
    if isinstance(value, bool):
      raise GridError(f"{where}: expected an integer")
    if isinstance(value, float) and value.is_integer():
      return int(value)
    if isinstance(value, int):
      return value
    raise GridError(f"{where}: expected an integer")
  if p.kind == "float":
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    raise GridError(f"{where}: expected a number")
  if p.kind == "dtype":
    try:
      return canonical_dtype(str(value))
    except GridError as e:
      raise GridError(f"{where}: {e}") from None
  return str(value)


# ------------------------------------------------------------ audits ----


def audit_summary(report) -> dict[str, Any]:
  """The numbers a sweep keeps of one audit (see `AuditReport`)."""
  by_class: dict[str, int] = {}
  for f in report.findings:
    by_class[f.kind.slug] = by_class.get(f.kind.slug, 0) + 1
  cost = report.cost_analysis or {}
  return {
      "kernels": len(report.kernels),
      "kernels_by_kind": dict(report.kernels_by_kind()),
      "materialized_bytes": report.materialized_bytes,
      "peak_bytes": report.peak_bytes,
      "xla_peak_bytes": report.xla_peak_bytes,
      "peak_agreement": report.peak_agreement,
      "bytes_saved": report.bytes_saved,
      "findings": len(report.findings),
      "actionable": len(report.actionable),
      "findings_by_class": by_class,
      "bytes_saved_by_class": dict(report.bytes_saved_by_class()),
      "instructions": report.module.instruction_count,
      "schedule_length": report.module.schedule_length,
      "flops": cost.get("flops"),
      **step_summary(report.timing),
      "platform": report.module.platform,
      # Only for a GPU target: earlier records keep their keys.
      **({"target": report.module.target} if report.module.target else {}),
  }


#: The estimate's keys in a point's audit summary: the step and its split,
#: in seconds (they sum to the step).
TIME_KEYS = ("step_time", "memory_time", "compute_time", "launch_time",
             "communication_time")


def step_summary(timing) -> dict[str, Any]:
  """The estimated step (`time_model.StepTime`) as a sweep keeps it: seconds
  per step, its split, and the device it is for (`time_device`); None in
  each where the audit has no estimate (the device unknown)."""
  if timing is None:
    return {**dict.fromkeys(TIME_KEYS), "time_device": None}
  return {**{k: float(getattr(timing, k)) for k in TIME_KEYS},
          "time_device": timing.facts.name}


#: The module's source tables (`FileNames` ... `StackFrames`): each a title
#: line, then rows up to a blank line.
_SOURCE_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def program_fingerprint(hlo_text: str) -> str:
  """A hash of the program in `hlo_text`, without its source metadata: the
  Python stack XLA keeps (`metadata={...}`, the stack-frame tables) differs
  with where the compile was called from (this process, a worker process, a
  Ray task) while the program is the same."""
  kept: list[str] = []
  skipping = False
  for line in hlo_text.splitlines():
    if skipping:
      skipping = bool(line.strip())
      continue
    if line.strip() in _SOURCE_TABLES:
      skipping = True
      continue
    kept.append(_without_metadata(line))
  return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def _without_metadata(line: str) -> str:
  """`line` without its `, metadata={...}` (braces inside quoted strings, as
  in an op_name, do not end it)."""
  start = line.find(", metadata={")
  if start < 0:
    return line
  depth, quoted, escaped = 0, False, False
  for i in range(start + len(", metadata="), len(line)):
    c = line[i]
    if quoted:
      if escaped:
        escaped = False
      elif c == "\\":
        escaped = True
      elif c == '"':
        quoted = False
    elif c == '"':
      quoted = True
    elif c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return line[:start] + _without_metadata(line[i + 1:])
  return line


def compile_and_audit(fn, args, html_path: str | None = None,
                      kwargs: Mapping[str, Any] | None = None,
                      target: Any = None) -> dict[str, Any]:
  """Captures and audits `fn(*args)` (for `target`, a GPU, when given);
  returns the audit summary, the HLO fingerprint and the seconds spent
  compiling and analysing."""
  from hlo_audit._src.audit import audit_capture
  from hlo_audit._src.capture.capture import capture

  t0 = time.perf_counter()
  cap = capture(fn, *args, target=target, **(kwargs or {}))
  t1 = time.perf_counter()
  report = audit_capture(cap)
  t2 = time.perf_counter()
  if html_path:
    report.to_html(html_path)
  return {
      "audit": audit_summary(report),
      # Points with the same fingerprint compiled to the same program.
      "hlo_fingerprint": program_fingerprint(cap.hlo_text),
      "seconds": {"compile": t1 - t0, "analysis": t2 - t1},
  }


# ----------------------------------------------------------- example ----


class ExampleTarget(Target):
  """The built-in transformer block; every `TransformerConfig` field plus
  `backward` (the training step if true, else the forward loss)."""

  @functools.cached_property
  def params(self) -> tuple[Param, ...]:
    from hlo_audit._src.examples.transformer import TransformerConfig

    out = []
    for f in dataclasses.fields(TransformerConfig):
      kind = "dtype" if f.name == "dtype" else "int"
      out.append(Param(f.name, kind, f.default))
    out.append(Param("backward", "bool", True))
    return tuple(out)

  def run(self, params, measure, html_path=None):
    from hlo_audit._src.examples.transformer import TransformerConfig, example

    if measure.validate or measure.time:
      raise GridError("validate/time apply to kernel targets only")
    cfg = TransformerConfig(**{k: v for k, v in params.items() if k != "backward"})
    fn, args = example(cfg, backward=bool(params["backward"]))
    return compile_and_audit(fn, args, html_path, target=measure.compile_target())


# ------------------------------------------------- module:function ----

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv}


def _shown(expr: str) -> str:
  """A placeholder as a message shows it (the user's text, made printable)."""
  return "{" + printable(expr) + "}"


def _parse_placeholder(expr: str, where: str) -> ast.expr:
  try:
    return ast.parse(expr.strip(), mode="eval").body
  # ValueError: a NUL byte; RecursionError, MemoryError: the parser's stack,
  # for operators nested thousands deep.
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    raise GridError(f"{where}: {_shown(expr)} is not a name or an integer expression") from None


def _at(tree: ast.expr, values: Mapping[str, Value]) -> str:
  """' at b=8, d=0': the point's values of the names an expression uses (''
  for a bare name, whose value the message shows already)."""
  if isinstance(tree, ast.Name):
    return ""
  names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)})
  return (" at " + ", ".join(f"{n}={values.get(n)}" for n in names)) if names else ""


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _eval_int(expr: str, values: Mapping[str, Value], where: str) -> Value:
  """Evaluates a placeholder: a grid name, or integer arithmetic of names.

  Raises:
    GridError: naming the expression, and the point's values where they are
      at fault (a division by zero, arithmetic on a string).
  """
  tree = _parse_placeholder(expr, where)

  def ev(node):
    if isinstance(node, ast.Name):
      if node.id not in values:
        raise GridError(f"{where}: {_shown(expr)} uses {node.id!r}, which the grid does not set")
      return values[node.id]
    if isinstance(node, ast.Constant) and _is_int(node.value):
      return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
      a, b = ev(node.left), ev(node.right)
      if not (_is_int(a) and _is_int(b)):
        raise GridError(f"{where}: {_shown(expr)} does arithmetic on non-integers"
                        f"{_at(tree, values)}")
      if isinstance(node.op, ast.FloorDiv) and b == 0:
        raise GridError(f"{where}: {_shown(expr)} divides by zero{_at(tree, values)}")
      return _OPS[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
      a = ev(node.operand)
      if not _is_int(a):
        raise GridError(f"{where}: {_shown(expr)} does arithmetic on non-integers"
                        f"{_at(tree, values)}")
      return -a
    raise GridError(f"{where}: {_shown(expr)} is not a name or an integer expression "
                    "(+ - * // and parentheses)")

  try:
    return ev(tree)
  except RecursionError:
    raise GridError(f"{where}: {_shown(expr)} is nested too deeply") from None


def template_names(template: str) -> tuple[str, ...]:
  """The grid names an `--args` template uses, in order of first use."""
  names: list[str] = []
  for m in _PLACEHOLDER.finditer(template):
    tree = _parse_placeholder(m.group(1), "--args")
    for node in ast.walk(tree):
      if isinstance(node, ast.Name) and node.id not in names:
        names.append(node.id)
  return tuple(names)


def render_args(template: str, values: Mapping[str, Value]) -> tuple[str, ...]:
  """The template's arguments for one point, as canonical HLO shapes
  ('f32[8,128]'), labels dropped.

  Raises:
    GridError: for a malformed entry, an unknown element type, or a
      placeholder whose value at this point is not a dimension (a
      non-negative integer) inside the brackets.
  """
  from hlo_audit._src.cli.common import UsageError
  from hlo_audit._src.cli.run_cmd import parse_arg_spec

  out = []
  for entry in template.split(";"):
    if not entry.strip():
      continue
    where = f"--args entry {entry.strip()!r}"
    # Placeholders after the first '[' (outside placeholders) are dimensions.
    masked = _PLACEHOLDER.sub(lambda m: "_" * len(m.group(0)), entry)
    bracket_at = masked.find("[")

    def sub(m):
      v = _eval_int(m.group(1), values, where)
      if 0 <= bracket_at < m.start():
        if not _is_int(v) or v < 0:
          at = _at(_parse_placeholder(m.group(1), where), values)
          raise GridError(f"{where}: {_shown(m.group(1))} is {v!r}{at}, not a dimension "
                          "(a non-negative integer)")
        return str(v)
      return _hlo_type(v, where) if isinstance(v, str) else str(v)

    text = _PLACEHOLDER.sub(sub, entry).strip()
    label, sep, shape = text.partition("=")
    if sep and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", label.strip()):
      raise GridError(f"{where}: {label.strip()!r} is not a label")
    etype, bracket, dims = (shape if sep else text).replace(" ", "").partition("[")
    try:
      arg = parse_arg_spec(_hlo_type(etype, where) + bracket + dims)
    except UsageError as e:
      raise GridError(f"{where}: {e}") from None
    out.append(f"{hlo_dtypes.from_numpy(arg.dtype)}[{','.join(map(str, arg.shape))}]")
  if not out:
    raise GridError("--args: no arguments in the template")
  return tuple(out)


def _hlo_type(name: str, where: str) -> str:
  """An element type as XLA spells it ('float32' -> 'f32')."""
  if name in hlo_dtypes.NUMPY_NAMES:
    return name
  try:
    return hlo_dtypes.from_numpy(name)
  except KeyError:
    raise GridError(f"{where}: unknown element type {name!r}") from None


class FunctionTarget(Target):
  """A function of an importable module (a dotted name or a .py path),
  audited for the abstract arguments of an `--args` template."""

  def __init__(self, ref: TargetRef):
    super().__init__(ref)
    if not ref.args:
      raise GridError(f"--target {ref.text!r} needs --args, e.g. "
                      "--args 'x=f32[{b},{d}];w=f32[{d},{f}]'")
    self._uses = template_names(ref.args)
    self._fn = None

  @property
  def function(self):
    """The function (imported on first use).

    Raises:
      GridError: if the module cannot be imported or lacks the function.
    """
    if self._fn is None:
      from hlo_audit._src.cli.common import UsageError
      from hlo_audit._src.cli.run_cmd import load_function

      try:
        self._fn = load_function(self.ref.text)
      except UsageError as e:
        raise GridError(str(e)) from None
    return self._fn

  @property
  def params(self) -> tuple[Param, ...]:
    # Any name goes: the template's feed shapes, the others are keywords.
    return ()

  def resolve(self, values):
    missing = [n for n in self._uses if n not in values]
    if missing:
      raise GridError(f"--args uses {', '.join(missing)}, which the grid does not set")
    static = {k: v for k, v in values.items() if k not in self._uses}
    if static:
      self._check_keywords(static)
    args = render_args(self.ref.args, values)
    return {**values, "args": ";".join(args)}

  def identity(self, params):
    static = {k: v for k, v in params.items() if k not in self._uses and k != "args"}
    return {"target": self.ref.text, "args": params["args"], "kwargs": static}

  def _check_keywords(self, static: Mapping[str, Value]) -> None:
    fn = getattr(self.function, "__wrapped__", self.function)
    try:
      sig = inspect.signature(fn)
    except (TypeError, ValueError):
      return  # A builtin without a signature: let the call decide.
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
      return
    for name in static:
      if name not in sig.parameters:
        raise GridError(f"grid name {name!r} is not used by --args and is not a "
                        f"parameter of {self.ref.text!r}")

  def run(self, params, measure, html_path=None):
    import jax

    from hlo_audit._src.cli.run_cmd import parse_arg_spec

    if measure.validate or measure.time:
      raise GridError("validate/time apply to kernel targets only")
    args = [parse_arg_spec(s) for s in params["args"].split(";")]
    static = {k: v for k, v in params.items() if k not in self._uses and k != "args"}
    fn = self.function
    if static:
      # Bound as Python values, so the function sees them as static.
      fn = jax.jit(functools.partial(getattr(fn, "__wrapped__", fn), **static))
    return compile_and_audit(fn, args, html_path, target=measure.compile_target())


# ------------------------------------------------------------ kernels ----


def kernel_targets() -> dict[str, Any]:
  """The ops the installed kernel libraries offer sweeps
  (`KernelLibrary.sweep_targets`), by name; a name two libraries offer is
  the first's, and each is also reachable as "<library>.<op>"."""
  from hlo_audit._src.analysis.kernel_library import installed_libraries

  out: dict[str, Any] = {}
  for lib in installed_libraries().libraries:
    for name, target in lib.sweep_targets().items():
      out.setdefault(name, target)
      out[f"{lib.name}.{name}"] = target
  return out


class KernelTarget(Target):
  """A kernel library's op at one shape: the audit of its XLA implementation
  (what XLA materializes without the kernel), the op's own cost model, and
  optionally validation and timing rows for the point, all measured by the
  library (`KernelSweep.run`)."""

  def __init__(self, ref: TargetRef, sweep):
    super().__init__(ref)
    self._sweep = sweep

  @property
  def params(self) -> tuple[Param, ...]:
    return tuple(self._sweep.params)

  def run(self, params, measure, html_path=None):
    target = measure.compile_target()
    return self._sweep.run(params, measure, lambda fn, args: compile_and_audit(
        fn, args, html_path, target=target))

"""Ask an op's own guard about a call without running it (a dry run).

`check_guard` is the public question ("would the kernel run for these
shapes and dtypes, here?"); `dry_run` is the swap's, which also wants the
abstract result. The op runs under `jax.eval_shape` on abstract arguments with its guard's
fallback records collected locally (`guard.collect_fallbacks`), so the answer
is exactly the public API's: the guard's reason, a ValueError for an invalid
call, or None when the kernel would run. `swap` asks before replacing a
pattern; the audit's suggestions ask for the user's shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src import registry

_cache: dict[Any, tuple[str | None, Any]] = {}
_backends: dict[Any, str] = {}
_lock = threading.Lock()


def op_functions() -> dict[str, Any]:
  """name -> public function of every op (its spec's `api`; the fused
  cross-entropy's takes the shape swap needs its losses in), and the
  attention chain's routing to JAX's fused attention."""
  from pallas_kernels._src.swap import attention, cross_entropy, group_norm  # noqa: PLC0415
  found = {name: spec.api for name, spec in registry.specs().items() if spec.api}
  found[attention.OP] = attention.attention
  if cross_entropy.OP in found:  # the same op, its losses shaped as the program's
    found[cross_entropy.OP] = cross_entropy.linear_cross_entropy
  if group_norm.OP in found:  # the same op, with its statistics and backward
    found[group_norm.OP] = group_norm.group_norm
  return found


def _key(x) -> Any:
  if isinstance(x, jax.ShapeDtypeStruct):
    return ("array", tuple(x.shape), str(x.dtype))
  return ("value", x)


def dry_run(op: str, positional: Sequence[Any], keywords: Mapping[str, Any] | None = None,
            static: Mapping[str, Any] | None = None,
            interpret: bool | None = None) -> tuple[str | None, Any]:
  """(reason the kernel would not run, abstract result) of an op call.

  Args:
    op: "matmul", "layer_norm", "rms_norm" or "softmax".
    positional: the op's positional arguments: ShapeDtypeStructs or Python
      scalars.
    keywords: array (ShapeDtypeStruct) or scalar keyword arguments.
    static: other keyword arguments (activation=, eps=, out_dtype=, ...).
    interpret: Pallas interpret mode (None: where nothing compiles kernels).

  Returns:
    (None, result ShapeDtypeStructs) when the kernel runs; (reason, result or
    None) when it falls back ("invalid call: ..." for a ValueError).
  """
  keywords = dict(keywords or {})
  static, key = _call_key(op, positional, keywords, static, interpret)
  with _lock:
    if key in _cache:
      return _cache[key]
  fn = op_functions()[op]
  arrays = [x for x in list(positional) + list(keywords.values())
            if isinstance(x, jax.ShapeDtypeStruct)]
  names = list(keywords)

  def call(*abstract):
    it = iter(abstract)
    pos = [next(it) if isinstance(x, jax.ShapeDtypeStruct) else x for x in positional]
    kw = {n: next(it) if isinstance(keywords[n], jax.ShapeDtypeStruct) else keywords[n]
          for n in names}
    return fn(*pos, **kw, **static)

  with guard.collect_fallbacks() as sink:
    try:
      out = jax.eval_shape(call, *arrays)
      reason = sink[0].reason if sink else None
    except (ValueError, TypeError) as e:
      out, reason = None, f"invalid call: {str(e).splitlines()[0]}"
  kernel_backend = "" if reason else (sink.choices[0].backend if sink.choices else "triton")
  with _lock:
    _cache[key] = (reason, out)
    _backends[key] = kernel_backend
  return reason, out


def last_kernel_backend(op: str, positional, keywords=None, static=None,
                        interpret: bool | None = None) -> str:
  """The backend `dry_run` found for the same call ("" when it falls back)."""
  _, key = _call_key(op, positional, dict(keywords or {}), static, interpret)
  with _lock:
    return _backends.get(key, "")


def _call_key(op: str, positional, keywords: Mapping[str, Any], static, interpret):
  """(the op's static keywords for a kernel call, the call's cache key)."""
  static = dict(static or {}, implementation="pallas",
                interpret=backend.resolve_interpret(interpret))
  key = (op, tuple(map(_key, positional)), tuple(sorted((k, _key(v)) for k, v in keywords.items())),
         tuple(sorted(static.items(), key=str)), backend.target())
  return static, key


@dataclasses.dataclass(frozen=True, slots=True)
class GuardCheck:
  """What an op's guard says about one call, asked without running it."""

  #: The op asked: "matmul", "layer_norm", "rms_norm" or "softmax".
  op: str
  #: Why the call would fall back to XLA ("invalid call: ..." when the op
  #: rejects the call); None when the kernel runs.
  reason: str | None
  #: The backend the call was traced for: "cpu", "gpu" or "tpu".
  backend: str
  #: `device_kind` of that device, e.g. "NVIDIA H200" or "cpu".
  device_kind: str
  #: Whether Pallas interprets the kernel there (no GPU or TPU).
  interpret: bool
  #: The Pallas backend the kernel is built with ("mosaic_gpu", "triton"), ""
  #: when the call falls back.
  kernel_backend: str = ""

  @property
  def runs(self) -> bool:
    """True when the kernel, not XLA, would run the call."""
    return self.reason is None


def check_guard(op: str, *args: Any, interpret: bool | None = None, target: Any = None,
                **kwargs: Any) -> GuardCheck:
  """Asks `op`'s guard whether its kernel would run `op(*args, **kwargs)` on
  the target device (see `pallas_kernels` backends), without running
  anything.

  Args:
    op: "matmul", "layer_norm", "rms_norm" or "softmax".
    *args: the op's positional arguments: arrays or `jax.ShapeDtypeStruct`s
      (only shapes and dtypes are read), or Python scalars.
    interpret: the op's `interpret=` (None: interpret where no GPU or TPU is).
    target: the device asked about ("h200", a `jax.Device`, a `Target`, as
      `backend.resolve_target` takes it); None: the current target.
    **kwargs: the op's other keyword arguments, arrays or values, as the
      public op takes them (activation=, eps=, out_dtype=, ...).

  Raises:
    ValueError: for an unknown op, or `implementation=` (always "pallas" here).
  """
  ops = op_functions()
  if op not in ops:
    raise ValueError(f"check_guard: unknown op {op!r}; known: {', '.join(ops)}")
  if "implementation" in kwargs:
    raise ValueError("check_guard asks the Pallas kernel's guard: drop implementation=")

  def abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct) or not hasattr(x, "shape"):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype)

  resolved = backend.resolve_target(target)
  with backend.targeting(resolved) if resolved is not None else contextlib.nullcontext():
    positional = [abstract(x) for x in args]
    keywords = {k: abstract(v) for k, v in kwargs.items()}
    reason, _ = dry_run(op, positional, keywords, interpret=interpret)
    t = backend.target()
    return GuardCheck(op=op, reason=reason, backend=t.backend.value,
                      device_kind=t.device_kind,
                      interpret=backend.resolve_interpret(interpret),
                      kernel_backend=last_kernel_backend(op, positional, keywords,
                                                         interpret=interpret))

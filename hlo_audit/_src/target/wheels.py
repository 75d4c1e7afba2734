"""The wheels a GPU target needs, and the one pip command that installs them.

Compiling for a GPU without one takes the CUDA PJRT plugin of the installed
jaxlib (`jax-cuda12-plugin` and `jax-cuda12-pjrt`, at jaxlib's exact
version: the plugin refuses any other) and `ptxas` (`nvidia-cuda-nvcc-cu12`,
or a CUDA toolkit on PATH). No cuDNN or cuBLAS wheel is needed: nothing runs.
`pip install 'hlo-audit[gpu-target]'` brings them: the extra asks for
`jax[cuda12-local]`, which jax itself pins to its own version.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile

from hlo_audit._src import compat
from hlo_audit._src.errors import TargetError

#: The plugin's wheels (their version must be jaxlib's).
PLUGIN_WHEELS = ("jax-cuda12-plugin", "jax-cuda12-pjrt")
#: ptxas and libdevice; the plugin's own floor for CUDA 12.
NVCC_WHEEL = "nvidia-cuda-nvcc-cu12"
NVCC_FLOOR = "12.6.85"


def _version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def pip_command(jaxlib_version: str | None = None) -> str:
  """The pip command that installs what a GPU target needs."""
  version = jaxlib_version or compat.JAXLIB_VERSION_TEXT
  pins = " ".join(f"'{w}=={version}'" for w in PLUGIN_WHEELS)
  return f"pip install {pins} '{NVCC_WHEEL}>={NVCC_FLOOR}'"


def problems() -> list[str]:
  """What is missing or mismatched, one phrase each; [] when all is there."""
  want = compat.JAXLIB_VERSION_TEXT
  out = []
  for wheel in PLUGIN_WHEELS:
    have = _version(wheel)
    if have is None:
      out.append(f"{wheel} is not installed")
    elif want and have != want:
      out.append(f"{wheel} {have} does not match jaxlib {want}")
  if _version(NVCC_WHEEL) is None and shutil.which("ptxas") is None:
    out.append(f"no ptxas ({NVCC_WHEEL} is not installed and no CUDA toolkit is on PATH)")
  return out


def require_gpu_wheels() -> None:
  """Raises one line naming the pip command when a wheel is missing.

  Raises:
    TargetError: "compiling for a GPU target needs ...: pip install ...".
  """
  found = problems()
  if found:
    raise TargetError(f"compiling for a GPU target needs the CUDA plugin of jaxlib "
                      f"{compat.JAXLIB_VERSION_TEXT or '(not installed)'} ("
                      f"{'; '.join(found)}): {pip_command()}")


def require_for(target) -> None:
  """Raises one line naming the pip command when a wheel `target` (a
  `target.Target`) compiles with is missing: libtpu for a TPU, the CUDA
  plugin for a GPU.

  Raises:
    TargetError: as `require_tpu_wheel` and `require_gpu_wheels`.
  """
  if getattr(target, "tpu", None) is not None:
    require_tpu_wheel()
  else:
    require_gpu_wheels()


def has_nvidia_gpu() -> bool:
  """Whether the machine shows an NVIDIA GPU to its processes (Linux device
  nodes), without starting JAX."""
  return os.path.exists("/dev/nvidia0") or bool(glob.glob("/proc/driver/nvidia/gpus/*"))


def cpu_unless_accelerator(environ=os.environ) -> bool:
  """Makes JAX start on the CPU (`JAX_PLATFORMS=cpu`) when a target's
  wheels are installed on a machine without their device (the CUDA plugin
  without a GPU, libtpu without a TPU) and the user chose no platform: the
  plugin then starts without its device (a target compiles), and JAX prints
  no traceback about the cuDNN it looks for, nor libtpu its lines about the
  TPU VM this is not. Call before JAX starts; returns whether it set it."""
  from hlo_audit._src.target import specs

  if "JAX_PLATFORMS" in environ:
    return False
  cuda = specs.plugin_library() is not None
  tpu = libtpu_version() is not None
  if (cuda and has_nvidia_gpu()) or (tpu and has_tpu()) or not (cuda or tpu):
    return False
  environ["JAX_PLATFORMS"] = "cpu"
  return True


# What jaxlib 0.11's CUDA libraries log to the process's stderr while `import
# jax` loads them on a machine without a GPU (C++, before absl's logging
# starts; jaxlib 0.12 logs nothing there): three times these two lines.
_IMPORT_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR$|^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on "
    r"your machine, GPU will not be used\.$")


@contextlib.contextmanager
def _stderr_without(noise: re.Pattern):
  """The process's stderr (file descriptor 2, where C++ writes too) with the
  lines `noise` matches left out; the others are passed on when it ends."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      lines = tmp.read().decode(errors="replace").splitlines(keepends=True)
      kept = "".join(line for line in lines if not noise.match(line.rstrip("\n")))
      if kept:
        os.write(2, kept.encode())


# ------------------------------------------------------------------ TPUs ----

#: The wheel XLA:TPU comes in (libtpu.so), at the version the installed jax
#: pins in its `tpu` extra.
TPU_WHEEL = "libtpu"


def libtpu_version() -> str | None:
  return _version(TPU_WHEEL)


def libtpu_pin() -> str | None:
  """The libtpu version the installed jax asks for (`jax[tpu]`'s pin)."""
  try:
    requires = importlib.metadata.requires("jax") or ()
  except importlib.metadata.PackageNotFoundError:
    return None
  for req in requires:
    m = re.match(r"^libtpu\s*==\s*([^\s;]+)\s*;.*extra\s*==\s*['\"]tpu['\"]", req)
    if m:
      return m.group(1)
  return None


def _matches(version: str, pin: str) -> bool:
  """`version` satisfies `==pin` (a pin may end in `.*`: "0.0.42.*")."""
  if pin.endswith(".*"):
    return version == pin[:-2] or version.startswith(pin[:-1])
  return version == pin


def tpu_pip_command() -> str:
  jax_version = _version("jax")
  return f"pip install 'jax[tpu]=={jax_version}'" if jax_version else "pip install 'jax[tpu]'"


def require_tpu_wheel() -> None:
  """Raises one line naming the pip command when libtpu is missing, or is
  not the version the installed jax pins.

  Raises:
    TargetError: "compiling for a TPU target needs libtpu ...: pip install ...".
  """
  have, want = libtpu_version(), libtpu_pin()
  if have is None:
    problem = "libtpu is not installed"
  elif want and not _matches(have, want):
    problem = f"libtpu {have} is not the {want} jax {_version('jax')} pins"
  else:
    return
  raise TargetError(f"compiling for a TPU target needs libtpu ({problem}): "
                    f"{tpu_pip_command()} (or pip install 'hlo-audit[tpu-target]')")


def has_tpu() -> bool:
  """Whether the machine shows a TPU to its processes (Linux device nodes)."""
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def prepare_libtpu(environ=os.environ) -> None:
  """Lets this process load libtpu beside another that holds its lockfile
  (a notebook that compiled for a TPU, a second CLI), on a machine with no
  TPU: a compile-only topology opens no chip, so the lock guards nothing.
  Call before libtpu loads."""
  if not has_tpu():
    environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


# What libtpu writes to the process's stderr when it loads on a machine that
# is no TPU VM (it looks for the VM's accelerator type and worker hosts).
_LIBTPU_NOISE = re.compile(
    r"^(Failed to find host bounds for accelerator type: )?WARNING: could not determine TPU"
    r"|^WARNING: Logging before InitGoogle\(\) is written to STDERR$"
    r"|^E\d{4} [\d:.]+ +\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker "
    r"hostname 'WARNING: could not determine TPU"
    r"|^=== Source Location Trace: === *$"
    r"|^learning/[\w/.-]+\.cc:\d+$"
    r"|^.*ALLOW_MULTIPLE_LIBTPU_LOAD is set to True")


@contextlib.contextmanager
def libtpu_quietly():
  """Loads libtpu (inside the block) without its lines about the TPU VM this
  machine is not."""
  with _stderr_without(_LIBTPU_NOISE):
    yield


def import_jax_quietly() -> None:
  """Imports JAX without the lines above, where the CUDA plugin is installed
  and JAX is not imported yet: a command's one-line error stays one line."""
  from hlo_audit._src.target import specs

  if "jax" in sys.modules or specs.plugin_library() is None:
    return
  with _stderr_without(_IMPORT_NOISE):
    import jax  # noqa: F401  (imported here, where its logs are filtered)

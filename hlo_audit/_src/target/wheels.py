"""The wheels a GPU target needs, and the one pip command that installs them.

Compiling for a GPU without one takes the CUDA PJRT plugin of the installed
jaxlib (`jax-cuda12-plugin` and `jax-cuda12-pjrt`, at jaxlib's exact
version: the plugin refuses any other) and `ptxas` (`nvidia-cuda-nvcc-cu12`,
or a CUDA toolkit on PATH). No cuDNN or cuBLAS wheel is needed: nothing runs.
`pip install 'hlo-audit[gpu-target]'` brings them: the extra asks for
`jax[cuda12-local]`, which jax itself pins to its own version.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import shutil

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


def has_nvidia_gpu() -> bool:
  """Whether the machine shows an NVIDIA GPU to its processes (Linux device
  nodes), without starting JAX."""
  return os.path.exists("/dev/nvidia0") or bool(glob.glob("/proc/driver/nvidia/gpus/*"))


def cpu_unless_gpu(environ=os.environ) -> bool:
  """Makes JAX start on the CPU (`JAX_PLATFORMS=cpu`) when the CUDA plugin is
  installed on a machine without a GPU and the user chose no platform: the
  plugin then starts without a GPU (a target compiles), and JAX prints no
  traceback about the cuDNN it looks for. Call before JAX starts; returns
  whether it set it."""
  from hlo_audit._src.target import specs

  if "JAX_PLATFORMS" in environ or specs.plugin_library() is None or has_nvidia_gpu():
    return False
  environ["JAX_PLATFORMS"] = "cpu"
  return True

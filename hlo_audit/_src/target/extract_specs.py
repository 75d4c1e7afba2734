"""Refreshes hlo-audit's copies of XLA's GPU specs from the installed CUDA plugin.

A maintainer's tool, kept beside the copies it writes (`specs/<name>.txtpb`):
each CUDA spec the installed jax-cuda12-pjrt plugin embeds, XLA's text as is,
license header included. The copies serve plugins that embed none (jax
0.11.2 and older). Run it with the plugin named in `specs.BUNDLED_FROM`
installed, then update that constant if it changed:

  JAX_PLATFORMS=cpu python -m hlo_audit._src.target.extract_specs

Exit status 2, with one line saying why, when no plugin (or one embedding no
specs) is installed.
"""

from __future__ import annotations

import sys

from hlo_audit._src.target import specs


def main() -> int:
  found = specs.plugin_library()
  if found is None:
    print("extract_specs: no CUDA plugin installed: pip install 'hlo-audit[gpu-target]'",
          file=sys.stderr)
    return 2
  embedded = specs.plugin_specs()
  if not embedded:
    print(f"extract_specs: {found[1]} embeds no specs (0.12 and newer do)", file=sys.stderr)
    return 2
  specs.BUNDLED_DIR.mkdir(exist_ok=True)
  for spec in embedded:
    (specs.BUNDLED_DIR / f"{spec.name}.txtpb").write_text(spec.text, encoding="utf-8")
    print(f"{spec.name:14s} {spec.device_kind} (sm_{spec.compute_capability})")
  print(f"{len(embedded)} specs from {found[1]} written to {specs.BUNDLED_DIR}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

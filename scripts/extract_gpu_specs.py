"""Writes the CUDA GPU specs the installed jax-cuda12-pjrt plugin embeds into
hlo-audit's copies (`hlo_audit/_src/target/specs/<name>.txtpb`).

The copies serve plugins that embed none (jax 0.11.2 and older); XLA's text
is kept as is, license header included. Run it with the plugin named in
`specs.BUNDLED_FROM` installed, then update that constant if it changed.

Example usage:
  JAX_PLATFORMS=cpu python scripts/extract_gpu_specs.py
"""

from __future__ import annotations

from absl import app

from hlo_audit._src.target import specs


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  found = specs.plugin_library()
  if found is None:
    raise app.UsageError("no CUDA plugin installed: pip install 'hlo-audit[gpu-target]'")
  embedded = specs.plugin_specs()
  if not embedded:
    raise app.UsageError(f"{found[1]} embeds no specs (0.12 and newer do)")
  specs.BUNDLED_DIR.mkdir(exist_ok=True)
  for spec in embedded:
    (specs.BUNDLED_DIR / f"{spec.name}.txtpb").write_text(spec.text, encoding="utf-8")
    print(f"{spec.name:14s} {spec.device_kind} (sm_{spec.compute_capability})")
  print(f"{len(embedded)} specs from {found[1]} written to {specs.BUNDLED_DIR}")


if __name__ == "__main__":
  app.run(main)

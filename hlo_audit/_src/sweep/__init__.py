"""Sweeps: audit a target over a grid of shapes and dtypes (`hlo-audit sweep`)."""

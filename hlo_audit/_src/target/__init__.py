"""Devices to compile for without having them: GPU specs and compile-only topologies."""

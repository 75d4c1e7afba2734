"""extract_specs: the plugin's specs written as hlo-audit's copies, XLA's text as is."""

from __future__ import annotations

from hlo_audit._src.target import extract_specs, specs


def test_writes_each_embedded_spec_as_is(monkeypatch, tmp_path, capsys):
  h200 = specs.find_spec("h200")
  monkeypatch.setattr(specs, "plugin_library", lambda: ("/x/xla_cuda_plugin.so",
                                                        "jax-cuda12-pjrt 9.9"))
  monkeypatch.setattr(specs, "plugin_specs", lambda: (h200,))
  monkeypatch.setattr(specs, "BUNDLED_DIR", tmp_path / "specs")
  assert extract_specs.main() == 0
  assert (tmp_path / "specs" / "h200.txtpb").read_text(encoding="utf-8") == h200.text
  assert "1 specs from jax-cuda12-pjrt 9.9 written" in capsys.readouterr().out


def test_without_a_plugin_says_what_to_install(monkeypatch, capsys):
  monkeypatch.setattr(specs, "plugin_library", lambda: None)
  assert extract_specs.main() == 2
  assert "pip install 'hlo-audit[gpu-target]'" in capsys.readouterr().err

"""The user's line a swapped call is reported at: JAX's summary of a
frame, read back as file, line and the text the report shows."""

from __future__ import annotations

import pytest

from pallas_kernels._src.swap import rewrite


@pytest.mark.parametrize("summary, frame", [
    ("model.py:12:5 (block)", ("model.py", 12, "model.py:12 (block)")),
    ("model.py:12 (block)", ("model.py", 12, "model.py:12 (block)")),
    ("model.py:12", ("model.py", 12, "model.py:12")),
    # A ':' in the path (a URL-like or drive path) stays in the file.
    ("C:/src/model.py:12 (block)", ("C:/src/model.py", 12, "C:/src/model.py:12 (block)")),
    ("zip:pkg/model.py:7:1 (f)", ("zip:pkg/model.py", 7, "zip:pkg/model.py:7 (f)")),
    ("unknown", ("", 0, "")),
    ("", ("", 0, "")),
    ("<no line> (f)", ("", 0, "<no line> (f)")),
])
def test_a_frame_summary_reads_as_file_and_line(summary, frame, monkeypatch):
  monkeypatch.setattr(rewrite.source_info_util, "summarize", lambda _: summary)
  assert rewrite._frame(object()) == frame

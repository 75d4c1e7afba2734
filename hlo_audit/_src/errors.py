"""Errors raised by hlo_audit: one base class, each also a matching builtin."""

from __future__ import annotations


class HloAuditError(Exception):
  """Base class of every error hlo_audit raises on purpose."""


class HloParseError(HloAuditError, ValueError):
  """HLO text that cannot be parsed.

  `str()` gives `source:line:column: message`, then the offending line and a
  caret under the column, as XLA's own parser does.
  """

  def __init__(self, message: str, *, line: int, column: int, line_text: str,
               source: str | None = None):
    #: What is wrong, e.g. "expected ')' at the end of operands".
    self.message = message
    #: 1-based line of the offending text.
    self.line = line
    #: 1-based column of the offending text.
    self.column = column
    #: The whole offending line, without its line break.
    self.line_text = line_text
    #: File the text came from, when known.
    self.source = source
    super().__init__(self.__str__())

  def __str__(self) -> str:
    where = f"{self.source}:" if self.source else ""
    text = self.line_text if len(self.line_text) <= 240 else self.line_text[:240] + "..."
    caret = " " * max(self.column - 1, 0) + "^" if self.column <= 240 else ""
    return f"{where}{self.line}:{self.column}: {self.message}\n{text}\n{caret}"

  def __reduce__(self):
    return (_rebuild_parse_error,
            (self.message, self.line, self.column, self.line_text, self.source))


def _rebuild_parse_error(message, line, column, line_text, source):
  return HloParseError(message, line=line, column=column, line_text=line_text,
                       source=source)


class CaptureError(HloAuditError, ValueError):
  """A function, its arguments or a compiled stage that cannot be captured."""


class DumpError(HloAuditError, ValueError):
  """An XLA dump folder or file that cannot be read as one."""


class TargetError(HloAuditError, ValueError):
  """A device to compile for that cannot be used: an unknown name, a bad spec
  file, missing or mismatched plugin wheels."""

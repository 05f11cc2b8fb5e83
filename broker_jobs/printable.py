"""Text from messages made safe to print on a terminal or in a text log line.

A job id, a key, a handler's error or a dead letter's body is anyone's text: a newline
in it forges a log line, an escape sequence clears an operator's screen or retitles
the terminal. Control characters are written as escapes (``\\n``, ``\\x1b``) instead;
JSON output needs none of this (its encoder escapes them).
"""

from __future__ import annotations

#: C0 controls, DEL and C1 controls, each as its escape; a tab stays a tab.
_ESCAPES = {
    code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code != 0x09
}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r"})
_ONE_LINE = str.maketrans(_ESCAPES)
_LINES = str.maketrans({code: escape for code, escape in _ESCAPES.items() if code != 0x0A})


def printable(text: str) -> str:
    """``text`` on one line, every control character escaped."""
    return text.translate(_ONE_LINE)


def printable_lines(text: str) -> str:
    """``text`` with its lines kept, every other control character escaped (a
    traceback, an indented payload)."""
    return text.translate(_LINES)

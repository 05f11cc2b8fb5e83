"""Text from messages made safe for a terminal or a text log line."""

from __future__ import annotations

from broker_jobs.printable import printable, printable_lines


def test_control_characters_are_escaped_and_tabs_and_text_kept() -> None:
    assert printable("a\nb\r\x1b[31mc\x07\x7f\x9b\td é") == "a\\nb\\r\\x1b[31mc\\x07\\x7f\\x9b\td é"
    assert printable_lines("line 1\nline\x1b 2") == "line 1\nline\\x1b 2"

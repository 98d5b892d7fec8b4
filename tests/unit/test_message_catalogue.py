"""The message catalogue (``docs/messages.md``) is what the messages say, and reads in
one voice: one unit name, no ``.0``, plural forms, no nested parentheses."""

from __future__ import annotations

import difflib
import re

from message_catalogue import COMMAND, PAGE, SECTIONS, catalogue


def test_the_page_is_what_the_message_functions_make():
    made = catalogue()
    written = PAGE.read_text()
    diff = "".join(
        difflib.unified_diff(
            written.splitlines(keepends=True),
            made.splitlines(keepends=True),
            "docs/messages.md",
            "generated",
        )
    )
    assert written == made, f"docs/messages.md is out of date: run `{COMMAND}`\n{diff}"


def _messages() -> list[str]:
    return [message for make in SECTIONS for _, message in make()[2]]


def _nested(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth > 1:
            return True
    return False


def test_every_message_keeps_the_rules():
    messages = _messages()
    assert len(messages) > 80
    for text in messages:
        # one unit name, whole numbers without ".0", singular for one
        assert not re.search(r"GPU-h\b(?!ours?)", text), text
        assert not re.search(r"\b\d+\.0\b", text), text
        assert not re.search(
            r"(?<![\d.])1 (spawns|servers|GPUs|GPU-hours|days|hours|minutes|seconds|nodes)\b",
            text,
        ), text
        # no "(s)" plurals, no times with seconds, no policy durations (8h, 15m)
        assert "(s)" not in text, text
        assert not re.search(r"\d\d:\d\d:\d\d", text), text
        assert not re.search(r"\b\d+[hmd]\b", text), text
        assert not _nested(text), text
        # the group's display name, never a key the policy writes
        assert "max_runtime" not in text, text
        assert "when_exhausted" not in text, text


def test_every_refusal_says_what_to_do_next():
    (refusals,) = [make()[2] for make in SECTIONS if make()[0] == "Spawn refusals"]
    steps = re.compile(
        r"stop (it|one)|try again|choose|ask an admin|an admin must|tell an admin|fix what|"
        r"start one without GPUs|check the command|only the form's choices"
    )
    for situation, text in refusals:
        assert steps.search(text), (situation, text)

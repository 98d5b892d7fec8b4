"""The policy's keys written out for people, from the one table (``keys``, ``settings``):
each ``GPUPolicy`` trait's help (``trait_help``: what ``--help-all`` and the generated
config file show) and the configuration reference's pages (``reference_markdown``,
written by the docs build). Pure: no I/O.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from typing import Any

from .keys import (
    AMOUNTS,
    BUDGET,
    CSI,
    DATASET,
    EGRESS,
    FAIR_SHARE,
    FLAVOR,
    FLAVOR_KINDS,
    GPU_REQUEST,
    GROUP,
    IDLE,
    INTERFACE,
    NFS,
    OPTION,
    OPTIONS,
    PER_USER,
    PROFILE,
    RATE,
    SCHEDULER,
    UNLISTED_CHOICE,
)
from .schema import Derived, Key, Section
from .settings import SETTINGS

#: the sections inside each setting, in the order the reference shows them
SECTIONS: dict[str, tuple[Section, ...]] = {
    "scheduler": (SCHEDULER,),
    "flavors": (FLAVOR, RATE, *FLAVOR_KINDS.values()),
    "profiles": (PROFILE, GPU_REQUEST, OPTIONS, OPTION, UNLISTED_CHOICE),
    "groups": (GROUP, AMOUNTS, PER_USER, BUDGET, IDLE),
    "fair_share": (FAIR_SHARE,),
    "interfaces": (INTERFACE,),
    "datasets": (DATASET, NFS, CSI),
    "egress": (EGRESS,),
}
_MARKDOWN_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _rst(text: str) -> str:
    """A key's help (Markdown's `code`) as reStructuredText (``code``)."""
    return _MARKDOWN_CODE.sub(r"``\1``", text)


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


def default_words(key: Key) -> str:
    """The default as the reference writes it (Markdown): ``required``, the words of a
    derived default, ``—`` for none."""
    if key.required:
        return "required"
    if key.default_words:
        return key.default_words
    if isinstance(key.default, Derived):
        return key.default.words
    if key.default is None or key.default in ({}, []):
        return "—"
    return f"`{_yaml(key.default)}`"


# ---- GPUPolicy's traits' help (reStructuredText) ------------------------------------


def _key_line(key: Key) -> str:
    default = default_words(key)
    said = "" if default == "—" else f" ({default})"
    return _rst(f"- `{key.name}`{said}: {key.help}")


def trait_help(name: str) -> str:
    """``GPUPolicy.<name>``'s help: the setting's line and details, then the keys inside
    it with their defaults and a line each."""
    setting = SETTINGS[name]
    parts = [_rst(_sentence(setting.help))]
    if setting.details:
        parts.append(textwrap.dedent(setting.details).strip())
    for inside in SECTIONS.get(name, ()):
        heading = _rst(f"Keys of `{inside.path}`." + (f" {inside.help}" if inside.help else ""))
        # a blank line between items: traitlets fills each paragraph of a help on its own
        parts.append("\n\n".join([heading, *(_key_line(k) for k in inside.keys.values())]))
    return "\n\n".join(parts)


# ---- the configuration reference (MyST Markdown) ------------------------------------


def _table(keys: Iterable[Key]) -> list[str]:
    rows = ["| key | type | default | what it is |", "|---|---|---|---|"]
    for key in keys:
        rows.append(f"| `{key.name}` | {key.type.doc} | {default_words(key)} | {key.help} |")
    return rows


def reference_markdown() -> str:
    """Every setting and the keys inside it: a heading per setting with its type,
    default and help, and a table per mapping inside it."""
    lines: list[str] = []
    for setting in SETTINGS.keys.values():
        lines += [
            f"### `{setting.name}`",
            "",
            f"{setting.type.doc}; default: {default_words(setting).replace('—', 'none')}",
            "",
            "```{eval-rst}",
            _rst(_sentence(setting.help)),
            "",
            textwrap.dedent(setting.details).strip(),
            "```",
            "",
        ]
        for inside in SECTIONS.get(setting.name, ()):
            if inside.path != setting.name:
                lines += [f"#### `{inside.path}`", ""]
            lines += [inside.help, ""] if inside.help else []
            lines += [*_table(inside.keys.values()), ""]
    return "\n".join(lines)

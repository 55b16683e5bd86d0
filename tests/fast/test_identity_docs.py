"""The agents' guide lists every header SAGA reads, and no other: the table in
docs/AGENTS.md cannot drift from `core.identity.IDENTITY_HEADERS`."""

from __future__ import annotations

import re
from pathlib import Path

from saga_server.core.identity import IDENTITY_HEADERS

DOC = Path(__file__).resolve().parents[2] / "docs" / "AGENTS.md"


def _documented() -> set[str]:
    text = DOC.read_text()
    start = text.index("## Coding agents as they are")
    lines = text[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return {name for line in table[2:] for name in re.findall(r"`([a-z0-9_-]+)(?::[^`]*)?`", line)}


def test_the_header_table_names_every_header_read_and_nothing_else():
    read = {name for hs in IDENTITY_HEADERS for name in (hs.session, hs.agent, hs.parent, hs.parent_agent, hs.final)
            if name}
    assert _documented() - {"true"} == read

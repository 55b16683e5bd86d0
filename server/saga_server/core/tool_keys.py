"""`ToolKey`: what the AEG counts a session as waiting on between two LLM steps.

A key is a tool by name and category (as hinted, else guessed), a gap between a
response and the next request when no tool is hinted (category `GAP`, named
``"~gap:o<k>"`` by the size of the response before it), or nothing (`NO_TOOL`).
The core keeps keys typed; `str(key)` is the key's name where text is needed: in
node names (``"after:<key>"``, `aeg`) and in the learnt state (`graph.learnt`),
whose names `from_name` reads back, at that edge only.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

__all__ = ["ToolKey", "NO_TOOL", "GAP", "gap_key"]

GAP = "~gap"  # the category of a gap: not a tool (categories starting "~" are pseudo-tools)


class ToolKey(NamedTuple):
    tool: str
    category: str = ""

    def __str__(self) -> str:
        """The key's name: ``"<tool>|<category>"``, or the tool alone without a
        category or for a gap (whose tool names it)."""
        if self.category and self.category != GAP:
            return f"{self.tool}|{self.category}"
        return self.tool

    @classmethod
    def from_name(cls, name: str, categories: Mapping[str, str]) -> ToolKey:
        """The key `name` (`str(key)`) stands for; `categories`: name -> category of
        the keys whose category is on record (the learnt state's timed tools)."""
        category = categories.get(name)
        if category is None:
            if name.startswith(GAP + ":"):
                return cls(name, GAP)
            tool, bar, category = name.rpartition("|")
            return cls(tool, category) if bar else cls(name)
        suffix = "|" + category
        if category and category != GAP and name.endswith(suffix):
            return cls(name[:-len(suffix)], category)
        return cls(name, category)


NO_TOOL = ToolKey("")


def gap_key(output_tokens: int) -> ToolKey:
    """The gap after a response of `output_tokens` (by powers of two, as node names
    without hints are)."""
    return ToolKey(f"{GAP}:o{min(output_tokens, 1 << 20).bit_length()}", GAP)

"""Tool categories, and a guesser for when hints name a tool but no category.

The categories are those of the saga-trace format: durations within a category
are alike (reads and greps take fractions of a second, installs and test runs
tens), so a category is the fallback whenever one tool has too few samples.
"""

from __future__ import annotations

import functools
import re

__all__ = ["CATEGORIES", "HUMAN", "guess_category"]

CATEGORIES: tuple[str, ...] = (
    "search", "read", "edit", "run", "test", "install", "git", "submit", "other", "api", "human",
)
# A wait for a person, not a tool: the agent handed the turn back to its user, whose
# next message may take minutes or hours. Clients hint it as a tool call of this
# category (name "human"), so its durations are learnt apart from the tools'.
HUMAN = "human"

# First match wins, so the specific patterns (a test run is also "python ...")
# come before the generic ones.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE))
    for cat, rx in (
        ("submit", r"\b(submit|final_answer|finish|complete_task|task_complete)\b|echo\s+\S*complete_task"),
        ("install", r"\b(pip3?|uv|conda|poetry|npm|yarn|apt(-get)?|brew|cargo)\s+(install|add)\b"
                    r"|setup\.py\s+(install|develop)|\binstall\b"),
        ("test", r"\b(pytest|py\.test|tox|nox|unittest|nosetests|jest|mocha|go\s+test|cargo\s+test)\b"
                 r"|\brun_?tests?\b|\btest_\w+\.py\b|\btests?\b"),
        ("git", r"\bgit\b"),
        ("edit", r"\bsed\s+-i\b|\bpatch\b|\bapply\b|\b(str_replace|edit|write|create|insert|replace)\w*"
                 r"|cat\s*(<<|>)|>\s*\S+\.\w+"),
        ("search", r"\b(grep|rg|ag|ack|find|locate|search|glob|ls|tree)\b"),
        ("read", r"\b(cat|head|tail|less|more|nl|view|read|open|sed\s+-n|awk)\w*"),
        ("api", r"\b(https?://|curl|wget|http|api|request|fetch|get_\w+|book_\w+|update_\w+|cancel_\w+)"),
        ("run", r"\b(python3?|bash|sh|node|ruby|go\s+run|make|run|exec|execute)\b"),
    )
)


def guess_category(tool: str, detail: str = "") -> str:
    """Category of a tool call from its name (and, if known, its command line).

    >>> guess_category("bash", "python -m pytest tests/test_x.py")
    'test'
    >>> guess_category("pip install", "")
    'install'
    """
    if detail:
        return _guess(f"{tool} {detail}".strip())
    return _guess_name(tool.strip())


def _guess(text: str) -> str:
    if not text:
        return "other"
    lowered = text.lower()
    if lowered in CATEGORIES:
        return lowered
    for cat, rx in _RULES:
        if rx.search(text):
            return cat
    return "other"


# The core guesses from the tool name alone on every tool call of a hint flood;
# names repeat, command lines do not, so only names are remembered (bounded).
_guess_name = functools.lru_cache(maxsize=4096)(_guess)

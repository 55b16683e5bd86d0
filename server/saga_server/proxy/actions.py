"""Tool calls that an agent writes as text: fenced shell blocks, observations, submit markers.

Many coding agents (mini-swe-agent and its kin) do not use the tool-calling
protocol: the model's answer holds the action as a fenced block (```bash ...```)
and the agent sends the command's output back as the next user message. For
such an answer `TextActions.find` returns one `TextAction` per fenced block in a
configured language; the tool is named after the program that does the work
(`cd repo && python -m pytest -x` -> "pytest") and categorised from the command
line, so that durations are learnt per kind of command. A block carrying a
submit marker (`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, `echo COMPLETE`, ...)
says the agent is done once it runs. `is_observation` tells whether a user
message looks like a command's output (`<returncode>`, `Observation:`, ...),
which is how the next request shows that the action ran. Patterns are
configurable; matching is pure and bounded (answers past `max_chars` are read
up to it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from saga_server.core.categories import guess_category

__all__ = ["TextAction", "TextActions"]

# Words before the program that does the work: prefixes, and builtins that set up.
_PREFIXES = {"sudo", "time", "timeout", "env", "nohup", "nice", "exec", "command"}
_SETUP = {"cd", "export", "source", ".", "set", "unset", "pushd", "popd", "true", ":"}
_SEGMENTS = re.compile(r"&&|\|\||;|\n")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class TextAction:
    command: str
    tool: str
    category: str
    submit: bool  # the agent submits: nothing follows this action


@dataclass(frozen=True)
class TextActions:
    """`fences`: the languages of an action's fenced block (case-insensitive);
    `submit`: regular expressions, any of which marks a submitting command;
    `observations`: regular expressions, any of which makes a user message an
    observation (searched at its start, within `observation_window` characters)."""

    fences: tuple[str, ...] = ("bash", "sh", "shell", "zsh", "console", "mswea_bash_command")
    submit: tuple[str, ...] = (r"COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", r"MINI_SWE_AGENT_FINAL_OUTPUT",
                               r"^\s*echo\s+[\"']?COMPLETE[\"']?\s*$")
    observations: tuple[str, ...] = (r"<returncode>", r"<output>", r"<output_head>", r"<warning>",
                                     r"^\W*(observation|output|stdout|stderr|exit (code|status)|return code)\b")
    observation_window: int = 400
    max_chars: int = 200_000

    def __post_init__(self) -> None:
        if not self.fences:
            raise ValueError("text actions need at least one fence language")
        langs = "|".join(re.escape(f) for f in self.fences)
        object.__setattr__(self, "_fence", re.compile(rf"```(?:{langs})[ \t]*\r?\n(.*?)```",
                                                      re.IGNORECASE | re.DOTALL))
        object.__setattr__(self, "_submit", [re.compile(p, re.MULTILINE) for p in self.submit])
        object.__setattr__(self, "_observation", [re.compile(p, re.IGNORECASE | re.MULTILINE)
                                                  for p in self.observations])

    def find(self, text: str) -> list[TextAction]:
        """The actions an assistant's text asks for, in order."""
        out = []
        for match in self._fence.finditer(text[:self.max_chars]):
            command = match.group(1).strip()
            if not command:
                continue
            tool = _program(command)
            out.append(TextAction(command, tool, guess_category(tool, command),
                                  any(p.search(command) for p in self._submit)))
        return out

    def is_observation(self, text: str) -> bool:
        head = text[:self.observation_window]
        return any(p.search(head) for p in self._observation)


def _program(command: str) -> str:
    """The program that does a command line's work: that of its last segment
    that is not set-up (`cd`, `export`, assignments), past prefixes (`sudo`,
    `timeout 60`); `python -m X` is X."""
    for segment in reversed(_SEGMENTS.split(command)):
        words = segment.split()
        while words and (words[0] in _PREFIXES or _ASSIGNMENT.match(words[0]) or words[0].isdigit()):
            words.pop(0)
        if not words or words[0] in _SETUP:
            continue
        name = os.path.basename(words[0])[:32] or "bash"
        if re.fullmatch(r"python[0-9.]*", name) and "-m" in words[:-1]:
            name = words[words.index("-m") + 1][:32]
        return name
    return "bash"

"""Docstrings and comments state contracts, invariants and bounds; what a benchmark measured
lives in docs/RESEARCH.md, where its command and its history are kept.

A *measured figure* here is a number directly followed by `x` or `%` (`1.11x`, `36%`,
`3.5x`, `~7%`) in a docstring (every bare string statement, found with `ast`) or a comment
(found with `tokenize`) of a module under `server/saga_server` or `sdk/saga_sdk`. `8 x H100`
(a shape, with a space) and `0x1f` (hex) are not figures.

A figure is allowed, narrowly, where the same statement defines the number instead of
reporting one:
- a trailing comment on a line of an assignment (`disk_bw: float = 2.5e9  # ...`): the
  comment documents the constant it sits on;
- the docstring directly under an assignment of a literal (an attribute docstring): it
  documents that constant;
- a docstring or comment line that says the number is a default, an assumption of a model,
  or a bound (`default`, `assume`/`assumed`/`assumes`, `bound`/`bounds`/`bounded`,
  `at most`, `at least` on the same line), e.g. "at most 2x the estimate".
Anything else goes to docs/RESEARCH.md, in the section it belongs to, and the docstring keeps
the rule it supported (or names that section). A section named as `docs/RESEARCH.md,
"<title>"` must begin a heading or a bold paragraph lead there, so a pointer cannot go stale.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "server" / "saga_server", ROOT / "sdk" / "saga_sdk")
RESEARCH = ROOT / "docs" / "RESEARCH.md"

FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[x%](?!\w)")
DEFINES = re.compile(r"\b(?:defaults?|assume[sd]?|bound(?:s|ed)?|at most|at least)\b", re.IGNORECASE)
SECTION_REFERENCE = re.compile(r'RESEARCH\.md, "([^"]+)"')


def measured_figures(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring or comment line holding a figure the rules above
    do not allow, in line order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    assigned = _assignment_lines(tree)
    found: set[tuple[int, str]] = set()
    for body in _bodies(tree):
        for before, stmt in zip([None, *body], body):
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                continue
            if _assigns_a_literal(before):
                continue  # a constant's own docstring
            for n in range(stmt.lineno, stmt.end_lineno + 1):
                if FIGURE.search(lines[n - 1]) and not DEFINES.search(lines[n - 1]):
                    found.add((n, lines[n - 1].strip()))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT or not FIGURE.search(tok.string) or DEFINES.search(tok.string):
            continue
        trailing = tok.line[:tok.start[1]].strip() != ""
        if trailing and tok.start[0] in assigned:
            continue  # documents the constant assigned on its line
        found.add((tok.start[0], tok.string))
    return sorted(found)


def _bodies(tree: ast.AST):
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body


_LITERAL = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.unaryop,
            ast.operator, ast.expr_context)


def _assigns_a_literal(stmt: ast.stmt | None) -> bool:
    """An assignment of a value written out in the source (numbers, strings and containers
    of them, with arithmetic): a constant, not something computed from names."""
    return (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
            and all(isinstance(node, _LITERAL) for node in ast.walk(stmt.value)))


def _assignment_lines(tree: ast.AST) -> set[int]:
    return {n for node in ast.walk(tree) if _assigns_a_literal(node)
            for n in range(node.lineno, node.end_lineno + 1)}


def test_no_measured_figures_in_docstrings_or_comments():
    offending = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            offending += [f"{name}:{n}: {text}" for n, text in measured_figures(path.read_text(encoding="utf-8"))]
    assert offending == [], (
        "measured figures in docstrings or comments (move them to docs/RESEARCH.md, keep the rule here;"
        " see this test's docstring for what may stay):\n" + "\n".join(offending))



def research_titles(markdown: str) -> list[str]:
    """Headings and bold paragraph leads of docs/RESEARCH.md, whitespace collapsed."""
    titles = re.findall(r"^#+\s+(.+)$", markdown, re.MULTILINE) + re.findall(r"\*\*([^*]+)\*\*", markdown)
    return [" ".join(t.split()) for t in titles]


def section_references(source: str) -> list[tuple[int, str]]:
    """(line, name) of every `docs/RESEARCH.md, "<section>"` in a docstring or a comment
    block (its lines joined, so a name may wrap)."""
    texts: list[tuple[int, str]] = [
        (node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    blocks: list[tuple[int, int, str]] = []  # comment blocks: first line, last line, text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line, text = tok.start[0], tok.string.lstrip("#")
        if blocks and blocks[-1][1] == line - 1:
            blocks[-1] = (blocks[-1][0], line, blocks[-1][2] + " " + text)
        else:
            blocks.append((line, line, text))
    texts += [(first, text) for first, _, text in blocks]
    return [(line, name) for line, text in texts for name in SECTION_REFERENCE.findall(" ".join(text.split()))]


def test_every_section_a_docstring_names_is_in_research():
    titles = research_titles(RESEARCH.read_text(encoding="utf-8"))
    missing = [f"{path.relative_to(ROOT).as_posix()}:{line}: {name}"
               for root in SCANNED for path in sorted(root.rglob("*.py"))
               for line, name in section_references(path.read_text(encoding="utf-8"))
               if not any(title.startswith(name) for title in titles)]
    assert missing == [], "sections named in docstrings or comments that docs/RESEARCH.md lacks:\n" + "\n".join(missing)


def test_the_scanner_tells_a_measurement_from_a_definition():
    source = '''"""Module.

The key recomputes 1.30x Belady's share.
The ratio's default, 1.15, keeps each quantile within ~7%.
"""
import math

LIMIT = 0.8  # about 80% of the peak
"""Priced at 80% of line rate."""


def f(x):
    """Waits at most 2x the estimate.

    In a benchmark it ran 36% faster."""
    # cut the share from 50% to 36%
    # 8 x H100, 0x1f, v2.0 are no figures
    y = math.floor(x)  # 3.5x slower in a benchmark (computed, no constant)
    return y
'''
    assert measured_figures(source) == [
        (3, "The key recomputes 1.30x Belady's share."),
        (15, 'In a benchmark it ran 36% faster."""'),
        (16, "# cut the share from 50% to 36%"),
        (18, "# 3.5x slower in a benchmark (computed, no constant)"),
    ]

from __future__ import annotations

import pytest

from saga_server.core import CATEGORIES, guess_category


@pytest.mark.parametrize("tool, detail, expected", [
    ("pytest", "", "test"),
    ("bash", "python -m pytest tests/test_fields.py -x", "test"),
    ("pip install", "", "install"),
    ("bash", "pip install -e .", "install"),
    ("bash", "git diff", "git"),
    ("bash", "grep -rn 'def foo' src/", "search"),
    ("bash", "cat setup.py", "read"),
    ("bash", "sed -i 's/a/b/' x.py", "edit"),
    ("str_replace_editor", "", "edit"),
    ("bash", "python reproduce.py", "run"),
    ("submit", "", "submit"),
    ("get_reservation_details", "", "api"),
    ("frobnicate", "", "other"),
    ("", "", "other"),
    ("Search", "", "search"),
])
def test_guess_category(tool, detail, expected) -> None:
    assert guess_category(tool, detail) == expected
    assert guess_category(tool, detail) in CATEGORIES

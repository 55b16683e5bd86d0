"""What users read (the README, docs, code, scripts, messages) points only at what a
clone of this repository has: never at a folder beside the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BESIDE_THE_CHECKOUT = "../" + "shared"  # spelled in two parts so this file does not match itself


def test_no_tracked_file_points_beside_the_checkout():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = [f"{name}:{n}" for name in files if (ROOT / name).is_file()
            for n, line in enumerate(_lines(ROOT / name), 1) if BESIDE_THE_CHECKOUT in line]
    assert hits == [], f"paths outside the repository, which users do not have: {hits}"


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, OSError):
        return []


def test_the_readme_stays_short_and_leads_to_every_doc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, "the README is the ten-minute read: details go in docs/"
    unlinked = [doc.name for doc in sorted((ROOT / "docs").glob("*.md")) if f"docs/{doc.name}" not in readme]
    assert unlinked == [], f"docs the README does not lead to: {unlinked}"

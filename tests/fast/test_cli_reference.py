"""`docs/CLI.md` is what the commands' argparse definitions print today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_reference_is_generated_from_the_commands_as_they_are():
    done = subprocess.run([sys.executable, "scripts/cli_reference.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{ROOT / 'sdk'}:{ROOT / 'server'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr + done.stdout

"""`saga serve` children of this checkout for the real tier: `ServeChild(args, log_path,
checkout=ROOT)` runs this checkout's `sdk` and `server` from the repository root
(`saga_server.serve_child` starts, waits for and stops it; `[saga] ready in` in its
log is ready).

    child = serve_child(["--num-gpu-blocks-override", "80"], log_path)
    child.wait_ready(600)
    child.stop()
"""

from __future__ import annotations

from pathlib import Path

from saga_server.serve_child import ServeChild

__all__ = ["ROOT", "serve_child"]

ROOT = Path(__file__).resolve().parents[2]


def serve_child(args: list[str], log_path: Path, **options) -> ServeChild:
    """A `saga serve --fast-start` child of this checkout (`options`: `ServeChild`'s)."""
    return ServeChild(["--fast-start", *args], log_path, checkout=ROOT, **options)

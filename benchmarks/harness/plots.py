"""Figures the benchmarks draw: matplotlib off-screen, written as PNG."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def png(path, *grid, dpi: int = 110, **subplots):
    """`plt.subplots(*grid, **subplots)` drawn off-screen: yields (figure, axes) and
    writes the figure to `path` when the block ends (matplotlib: the server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)

"""What every benchmark plot shares: matplotlib without a display, one look for the axes, saving."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_axes(ax, title: str, ylabel: str, hosts: Sequence[int]) -> None:
    """Seconds (from 0) against hosts, a tick per size measured, a light grid, the legend."""
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("hosts")
    ax.set_ylabel(ylabel)
    ax.set_xticks(sorted(hosts))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def save(fig, path: Path) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return True

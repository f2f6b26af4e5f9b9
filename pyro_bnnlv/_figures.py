"""Ground layer: the two figure conventions every plot helper of the package follows.

A helper draws into the caller's ``ax`` when given (:func:`new_axes`), returns the figure, writes
it only when given a ``path`` and closes only figures it created (:func:`finish_figure`); it
never changes matplotlib's backend. Imported by ``plotting``, ``diagnostics``, ``stats`` and
``models`` alike, so it depends on nothing in the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["finish_figure", "new_axes"]


def new_axes(ax: Any = None, figsize: tuple[float, float] = (7, 4)) -> tuple[Any, Any]:
    """``(figure, ax)``: the figure of the given ``ax``, or a new pyplot figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def finish_figure(fig: Any, path: str | Path | None, owned: bool, dpi: int = 120) -> Any:
    """Save ``fig`` to ``path`` if given; close it when this library created it (``owned``)."""
    if path is not None:
        if owned:
            fig.tight_layout()
        fig.savefig(Path(path), dpi=dpi)
        if owned:
            import matplotlib.pyplot as plt

            plt.close(fig)
    return fig

"""Ground layer: the two figure conventions every plot helper of the package follows.

A helper draws into the caller's ``ax`` when given (:func:`new_axes`), returns the figure, writes
it only when given a ``path`` and closes only figures it created (:func:`finish_figure`); it
never changes matplotlib's backend. Imported by ``plotting``, ``diagnostics``, ``stats`` and
``models`` alike, so it depends on nothing in the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["finish_figure", "new_axes", "panel_axes"]


def new_axes(ax: Any = None, figsize: tuple[float, float] = (7, 4)) -> tuple[Any, Any]:
    """``(figure, ax)``: the figure of the given ``ax``, or a new pyplot figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def panel_axes(axes: Any, n: int, what: str, width: float) -> tuple[Any, list[Any]]:
    """``(figure, axes)``: the figure of the given ``axes``, one per panel (``n`` of them: a
    ``ValueError`` naming ``what`` otherwise), or a new pyplot figure of one row of ``n`` panels
    ``width`` wide with shared x and y axes."""
    if axes is None:
        import matplotlib.pyplot as plt

        fig, grid = plt.subplots(1, n, figsize=(width * n, 3.5), squeeze=False, sharex=True, sharey=True)
        return fig, list(grid[0])
    axes = list(axes) if isinstance(axes, (list, tuple)) or hasattr(axes, "__len__") else [axes]
    if len(axes) != n:
        raise ValueError(f"axes has {len(axes)} entries for {n} {what}")
    return axes[0].figure, axes


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

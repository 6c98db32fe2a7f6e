"""The ladder's figures (``fedem-private ladder``, docs/baselines.md): read at a glance.

The headline figure draws one metric (full HR@10 by default) against the total epsilon, on
a log axis: one line per method family ("FedMF, tuned"), its point without privacy to the
right of a dashed separator (``no DP``); the private floor (DP-MostPop, one dashed grey
line per architecture asked for) in the legend; chance, MostPop and the ceiling (the best
centralised model, a band of one standard deviation) as horizontal lines labelled on the
figure itself, not in the legend. Settings are never in the legend: the ladder's markdown
lists them in a table beside the figure. The legend holds at most :data:`MAX_LEGEND`
entries; further families are drawn but named only in the table.

The input is a list of :class:`Point`, so the figure can be drawn from a ladder's own
runs or from results recorded elsewhere (``benchmarks/ladder.py --headline``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedem_private.privacy.registry import lookup  # noqa: E402

MAX_LEGEND = 8
ROLES = ("chance", "popularity", "floor", "ceiling", "federated")
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
          "tab:pink", "tab:olive", "tab:cyan")
#: a private curve's line by its mechanism's private floor (the DP-MostPop architecture of
#: its relation and trust model, Mechanism.floor): central solid, local dotted,
#: interaction-level dashed; no floor: solid
STYLES = {"central": "-", "interaction-local": "--", "local": ":"}
# DP-MostPop's curves: greys, each its own dash and a filled marker no horizontal line has,
# drawn above the references (FLOOR_ZORDER over REFERENCE_ZORDER): at large eps DP-MostPop
# meets MostPop's line, where crosses hid (issue 80)
FLOOR_STYLES = (("0.4", "--", "D"), ("0.6", ":", "s"), ("0.3", "-.", "^"), ("0.5", "--", "v"))
REFERENCE_ZORDER = 1.5
FLOOR_ZORDER = 3.0
METRIC_WORDS = {"hr10_full": "HR@10, full ranking", "ndcg10_full": "NDCG@10, full ranking",
                "hr10_sampled": "HR@10, sampled (1 + 99 negatives)",
                "ndcg10_sampled": "NDCG@10, sampled (1 + 99 negatives)"}


def _floor(mode: str | None) -> str | None:
    """The private floor of the mechanism ``mode`` (None: none, or no such mechanism)."""
    mech = lookup(mode)
    return None if mech is None else mech.floor


@dataclass(frozen=True)
class Point:
    """One rung at one epsilon, aggregated over seeds.

    ``family``: the short label its line carries ("FedMF, tuned"; "DP-MostPop, central");
    ``role``: one of :data:`ROLES`; ``mode``: the privacy mode (or DP-MostPop's
    architecture), ``none`` without privacy; ``eps``: where it sits on the axis (the total
    eps, the search's included where accounted), None without privacy; ``values``: metric
    -> (mean, standard deviation over seeds)."""

    family: str
    role: str
    mode: str
    eps: float | None
    values: dict[str, tuple[float, float]] = field(default_factory=dict)


def _private(points: Sequence[Point]) -> list[float]:
    return sorted({p.eps for p in points if p.eps is not None and math.isfinite(p.eps)})


def _no_dp_x(eps: list[float]) -> float:
    """Where the points without privacy sit: a decade and a half right of the largest eps."""
    return (max(eps) if eps else 1.0) * 10 ** 1.5


def _hline(ax: plt.Axes, point: Point, metric: str, text: str, style: str,
           at: float = 0.005) -> None:
    mean, sd = point.values[metric]
    ax.axhline(mean, color="0.35", linestyle=style, linewidth=1.0, zorder=REFERENCE_ZORDER)
    if point.role == "ceiling" and sd > 0:
        ax.axhspan(mean - sd, mean + sd, color="0.85", alpha=0.6, linewidth=0)
    ax.annotate(f"{text} {mean:.3f}", xy=(at, mean), xycoords=("axes fraction", "data"),
                xytext=(0, 2), textcoords="offset points", fontsize=8, color="0.25",
                va="bottom", bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none",
                                   "pad": 0.5})


def _families(points: Sequence[Point]) -> list[tuple[str, str, list[Point]]]:
    """(family, role, its points) of the floor and the federated rungs, in first-seen order."""
    out: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        if p.role in ("floor", "federated") and p.family:
            out.setdefault((p.family, p.role), []).append(p)
    return [(fam, role, pts) for (fam, role), pts in out.items()]


def draw(ax: plt.Axes, points: Sequence[Point], metric: str = "hr10_full") -> int:
    """Draw ``metric`` against eps on ``ax``; returns the number of legend entries."""
    points = [p for p in points if metric in p.values]
    eps = _private(points)
    nodp = _no_dp_x(eps)
    refs = {"chance": ("chance", ":"), "popularity": ("", "-."), "ceiling": ("", "--")}
    for i, p in enumerate(p for p in points if p.role in refs):
        word, style = refs[p.role]
        # labels alternate between the left and the middle, so close lines stay legible
        _hline(ax, p, metric, word or p.family, style, 0.005 if i % 2 == 0 else 0.45)
    colour = iter(COLORS)
    legend = floors = 0
    for fam, role, pts in _families(points):
        pts = sorted(pts, key=lambda p: nodp if p.eps is None else p.eps)
        xs = [nodp if p.eps is None else p.eps for p in pts]
        ys = [p.values[metric][0] for p in pts]
        sds = [p.values[metric][1] for p in pts]
        floor = role == "floor"
        if floor:  # the floors in greys, each its own dash and marker
            color, style, marker = FLOOR_STYLES[floors % len(FLOOR_STYLES)]
            floors += 1
        else:
            color, marker = next(colour, "0.2"), "o"
            style = STYLES.get(_floor(next((p.mode for p in pts if p.eps is not None),
                                           None)), "-")
        named = legend < MAX_LEGEND
        # the private points joined; the point without privacy (right of the separator)
        # stands alone: a line across the separator would read as values measured between
        private = [i for i, p in enumerate(pts) if p.eps is not None]
        alone = [i for i, p in enumerate(pts) if p.eps is None]
        for group, line in ((private, style), (alone, "none")):
            if not group:
                continue
            ax.errorbar([xs[i] for i in group], [ys[i] for i in group],
                        yerr=[sds[i] for i in group], color=color, linestyle=line,
                        marker=marker, markersize=5 if floor else 4, capsize=2,
                        linewidth=1.3, label=fam if named else None,
                        zorder=FLOOR_ZORDER if floor else 2.0,
                        markeredgecolor="white" if floor else None)
            named = False
        legend += legend < MAX_LEGEND
    ax.set_xscale("log")
    if eps:
        ax.axvline(math.sqrt(max(eps) * nodp), color="0.6", linestyle=":", linewidth=0.8)
    shown = sorted({float(f"{e:.2g}") for e in eps})  # 3.9998 (an accounted search) is 4
    ax.set_xticks([*shown, nodp])
    ax.set_xticklabels([f"{e:g}" for e in shown] + ["no DP"])
    ax.minorticks_off()
    ax.set_xlabel("total epsilon (log scale)")
    ax.set_ylabel(METRIC_WORDS.get(metric, metric))
    top = max((v[0] + v[1] for p in points for v in [p.values[metric]]), default=0.0)
    ax.set_ylim(0, top * 1.12 if top > 0 else None)
    ax.grid(alpha=0.3)
    return legend


def headline(points: Sequence[Point], path: str | Path, title: str,
             metric: str = "hr10_full") -> int:
    """Write the headline figure (``metric`` against eps) to ``path`` (PNG); returns the
    number of legend entries (at most :data:`MAX_LEGEND`)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    try:
        entries = draw(ax, points, metric)
        ax.set_title(title, fontsize=11)
        if entries:
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                      frameon=False)
        fig.tight_layout()
        fig.savefig(path, dpi=130)
    finally:
        plt.close(fig)
    return entries


def panels(points: Sequence[Point], path: str | Path, title: str,
           metrics: Sequence[str] = ("ndcg10_full", "hr10_sampled", "ndcg10_sampled")) -> None:
    """Write the report's other panels (one per metric, the headline's layout) to ``path``."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
    try:
        entries = 0
        for ax, metric in zip(axes[0], metrics, strict=True):
            entries = draw(ax, points, metric)
        if entries:
            handles, labels = axes[0][0].get_legend_handles_labels()
            fig.legend(handles, labels, fontsize=8, loc="lower center",
                       ncol=min(4, len(labels)), frameon=False)
        fig.suptitle(title, fontsize=11)
        fig.tight_layout(rect=(0, 0.12 if entries else 0, 1, 1))
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)

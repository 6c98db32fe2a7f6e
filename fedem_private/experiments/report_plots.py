"""PNG plots of a results table: utility vs eps, attack AUC vs eps, and the trade-off frontier.

Epsilon axes are logarithmic; the points without a finite epsilon sit to the
right of a break in the axis (a grey band with break marks), labelled: ``inf (clip
only)`` (a mode with eps = inf: clipped, no noise) and ``no DP`` (mode ``none``:
neither clipped nor noised). They are markers of their own, never joined to the
finite-eps curve: a segment across the break would read as measured values in between.
One colour per method variant, one line per (variant, privacy mode), or, for one
variant under several modes, one colour per mode; when several variants run under
several private modes (architectures compared), each mode gets its own row of panels.
Markers are the mean over seeds, error bars one standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedem_private.experiments.display import attack_display, variant_display  # noqa: E402
from fedem_private.privacy.registry import capability, no_privacy  # noqa: E402

CLIP_ONLY = "inf (clip only)"
NO_DP = "no DP"
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclass(frozen=True)
class Line:
    """One plotted line: a variant under one privacy mode (and protocol)."""

    label: str
    color: str
    style: str
    marker: str
    points: pd.DataFrame  # rows of the seed-aggregated table, with column "x_key"
    hollow: bool = False  # a variant's line under its second (third...) protocol
    zorder: float = 2.0  # above the horizontal references (REFERENCE_ZORDER) by default
    markersize: float = 6.0

    @property
    def face(self) -> str | None:
        """The marker's face colour: none for a hollow line, else the line's own."""
        return "none" if self.hollow else None


def _plain(mode: object) -> bool:
    """Whether a results row's mode is the mechanism that changes nothing (no DP); a
    baseline's release mode (dp-mostpop's) is not a registered mechanism, so private."""
    return no_privacy(mode)


def _plain_rows(agg: pd.DataFrame) -> pd.Series:
    return agg["mode"].map(_plain).astype(bool)


def x_key(mode: str, eps_target: float, eps_reported: float) -> float | str:
    """The epsilon a point is plotted at: a number, CLIP_ONLY or NO_DP."""
    if _plain(mode):
        return NO_DP
    eps = eps_target if not math.isnan(eps_target) else eps_reported  # paper: heuristic eps
    if math.isnan(eps) or math.isinf(eps):
        return CLIP_ONLY
    return float(eps)


def _tick_text(v: float) -> str:
    """A tick label: 0.3, 16, 1024, and powers of ten from 10^4 as 1e4."""
    if v >= 1e4 and math.log10(v).is_integer():
        return f"1e{int(math.log10(v))}"
    return f"{v:g}"


class EpsAxis:
    """Maps epsilons (and the two special points) to x positions on a log10 scale."""

    def __init__(self, keys: Sequence[float | str]) -> None:
        finite = sorted({k for k in keys if not isinstance(k, str)})
        self.finite = finite
        lo, hi = (math.log10(finite[0]), math.log10(finite[-1])) if finite else (0.0, 0.0)
        gap = max(0.6, 0.3 * (hi - lo))
        self.special = [k for k in (CLIP_ONLY, NO_DP) if k in set(keys)]
        self.pos = {k: hi + gap * (i + 1) for i, k in enumerate(self.special)}
        self.separator = hi + gap / 2 if finite and self.special else None
        self.span = max(0.6, (max(self.pos.values()) if self.pos else hi) - lo)

    def x(self, key: float | str) -> float:
        return self.pos[key] if isinstance(key, str) else math.log10(key)

    def decorate(self, ax: plt.Axes) -> None:
        ticks = [math.log10(v) for v in self.finite] + [self.pos[k] for k in self.special]
        labels = [_tick_text(v) for v in self.finite] + [k.replace(" (", "\n(")
                                                        for k in self.special]
        # a label closer than 1/12 of the axis to the last one shown stays unlabelled
        shown, last = [], -math.inf
        for i, (t, text) in enumerate(zip(ticks, labels, strict=True)):
            keep = i >= len(self.finite) or t - last >= self.span / 12
            shown.append(text if keep else "")
            last = t if keep else last
        ax.set_xticks(ticks, shown)
        ax.set_xlabel("total epsilon (log scale)")
        ticks_all = ticks or [0.0]
        pad = 0.35 * max(0.6, max(ticks_all) - min(ticks_all)) / 2
        ax.set_xlim(min(ticks_all) - pad, max(ticks_all) + pad)
        if self.separator is not None:
            self._break(ax)

    def _break(self, ax: plt.Axes) -> None:
        """The axis break between the finite epsilons and the special points: a light band
        (no scale runs across it) with a pair of slanted marks on the bottom spine, the
        usual broken-axis sign (on the top spine they would run into the title)."""
        assert self.separator is not None
        half = 0.04 * self.span
        ax.axvspan(self.separator - half, self.separator + half, color="0.93", zorder=0,
                   linewidth=0)
        for edge in (self.separator - half, self.separator + half):
            ax.plot([edge - 0.3 * half, edge + 0.3 * half], [-0.02, 0.02],
                    transform=ax.get_xaxis_transform(), color="0.35", linewidth=1,
                    clip_on=False, label="_nolegend_")


def lines(agg: pd.DataFrame, palette: Sequence[str] | None = None) -> list[Line]:
    """Group the aggregated rows into lines; mode ``none`` joins every line of its variant.

    ``palette``: the variants in colour order (default: those of ``agg``, sorted), so
    panels that each show some of the variants colour a variant alike.
    """
    variants = sorted(agg["variant"].unique())
    order = list(palette) if palette is not None else variants
    colors = {v: f"C{order.index(v) % 10}" for v in variants}
    modes = sorted(m for m in agg["mode"].unique() if not _plain(m))
    # one variant under several modes (architectures compared): a colour per mode
    by_mode = len(variants) == 1 and len(modes) > 1
    protocols = sorted(agg["protocol"].unique())
    out = []
    for v in variants:
        rows = agg[agg["variant"] == v]
        none_rows = rows[_plain_rows(rows)]
        pairs = set(zip(rows["mode"], rows["protocol"], strict=True))
        keys = sorted(k for k in pairs if not _plain(k[0]))
        # a plain point joins the private lines of its protocol; one whose protocol has
        # none is a line (a point) of its own, never dropped
        joined = {protocol for _, protocol in keys}
        keys += sorted(k for k in pairs if _plain(k[0]) and k[1] not in joined)
        for mode, protocol in keys:
            pts = rows[(rows["mode"] == mode) & (rows["protocol"] == protocol)]
            if not _plain(mode):
                pts = pd.concat([pts, none_rows[none_rows["protocol"] == protocol]])
            label = variant_display(v)
            if len(modes) > 1 and not _plain(mode):
                label += f" · {mode}" + (" (heuristic eps)"
                                         if capability(mode, "paper_heuristic") else "")
            if len(protocols) > 1:
                label += f" · {protocol}"
            style = STYLES[modes.index(mode) % len(STYLES)] if mode in modes else "-"
            # the same variant under two protocols (a tuned run's round chosen on
            # validation, say) would draw alike: the later protocols' markers are hollow
            hollow = protocols.index(protocol) > 0
            if by_mode and mode in modes:
                i = modes.index(mode)
                out.append(Line(label, f"C{i % 10}", style, MARKERS[i % len(MARKERS)], pts,
                                hollow))
                continue
            out.append(Line(label, colors[v], style, MARKERS[order.index(v) % len(MARKERS)],
                            pts, hollow))
    return out


def _ordered(points: pd.DataFrame, axis: EpsAxis) -> pd.DataFrame:
    return points.assign(_x=[axis.x(k) for k in points["x_key"]]).sort_values("_x")


def _plot_vs_eps(ax: plt.Axes, all_lines: list[Line], axis: EpsAxis, column: str) -> None:
    step = 0.025 * axis.span  # lines side by side, so equal values do not hide each other
    for i, line in enumerate(all_lines):
        pts = _ordered(line.points, axis)
        pts = pts[pts[f"{column}_mean"].notna()]
        if pts.empty:
            continue
        x = pts["_x"].to_numpy() + step * (i - (len(all_lines) - 1) / 2)
        y, err = pts[f"{column}_mean"].to_numpy(), pts[f"{column}_std"].fillna(0).to_numpy()
        finite = np.array([not isinstance(k, str) for k in pts["x_key"]])
        # the finite epsilons only: the points past the axis break stand alone
        ax.plot(x[finite], y[finite], color=line.color, linestyle=line.style,
                zorder=line.zorder)
        ax.errorbar(x, y, yerr=err, fmt=line.marker, color=line.color, capsize=3,
                    label=line.label, markersize=line.markersize, markerfacecolor=line.face,
                    zorder=line.zorder)
    axis.decorate(ax)
    ax.grid(alpha=0.3)


def architectures(agg: pd.DataFrame) -> list[tuple[str | None, pd.DataFrame]]:
    """The rows of panels a figure gets: one per privacy mode when several methods run under
    several private modes (architectures compared), each with that mode's rows and the
    runs without privacy; otherwise one, (None, every row).

    With one method the modes stay on one panel, a colour each (see :func:`lines`).
    """
    modes = sorted(str(m) for m in agg["mode"].unique() if not _plain(m))
    if len(modes) < 2 or agg["variant"].nunique() < 2:
        return [(None, agg)]
    return [(m, agg[(agg["mode"] == m) | _plain_rows(agg)]) for m in modes]


def _panel_rows(agg: pd.DataFrame) -> list[tuple[str | None, list[Line], EpsAxis]]:
    """Per row of panels (:func:`architectures`): its mode, its lines, coloured by the
    variants of the whole table so a method looks the same in every row, and its own
    epsilon axis."""
    palette = sorted(agg["variant"].unique())
    return [(mode, lines(sub, palette), EpsAxis(list(sub["x_key"])))
            for mode, sub in architectures(agg)]


def _titled(mode: str | None, title: str) -> str:
    return title if mode is None else f"{mode}: {title}"


def utility_figure(agg: pd.DataFrame, dataset: str, path: Path, random_full: float,
                   n_seeds: str) -> Path:
    """HR@10 (full ranking and sampled) against epsilon; a row of panels per architecture
    (:func:`architectures`), each with its own epsilon axis.

    The ladder (:mod:`~fedem_private.experiments.floors`): the non-private baselines are
    horizontal lines on every panel, and DP-MostPop is a dashed grey curve per
    architecture, on the panel of the federated mode with the same relation.
    """
    from fedem_private.experiments import floors as ladder

    models, floors = ladder.part(agg, "models"), ladder.part(agg, "floors")
    refs = ladder.part(agg, "references")
    base = models if not models.empty else (floors if not floors.empty else agg)
    extras = base is models
    palette = sorted(base["variant"].unique())
    panels = architectures(base)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4.2 * len(panels)), sharex=False,
                             squeeze=False)
    for row, (mode, sub) in zip(axes, panels, strict=True):
        fl = ladder.floors_for(floors, mode) if extras else floors.iloc[0:0]
        all_lines = lines(sub, palette) + floor_lines(fl)
        axis = EpsAxis(list(sub["x_key"]) + list(fl["x_key"]))
        for ax, column, title, rand in (
                (row[0], "hr10_full", "HR@10, full ranking", random_full),
                (row[1], "hr10_sampled", "HR@10, sampled (1 + 99 negatives)", 0.1)):
            _plot_vs_eps(ax, all_lines, axis, column)
            ends = [chance_line(ax, rand)] if rand > 0 else []
            if extras:
                ends += reference_lines(ax, refs, column)
            ax.set_ylim(bottom=0)
            end_labels(ax, ends)
            ax.set_title(_titled(mode, title))
            ax.set_ylabel("HR@10")
    handles: dict[str, object] = {}
    for ax in axes.flat:  # one legend for the figure: every panel shares its labels
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(handles)), fontsize=8,
               frameon=False)
    fig.suptitle(f"{dataset}: utility vs privacy budget ({_over(n_seeds)})")
    return _save(fig, path)


#: each non-private baseline's look, by method (floors.method_of of its variant): a colour
#: none of the first model colours (C0-C3) takes, a dash pattern of its own, and the name
#: written at the line's right end, so no two references can be confused in print or grey
REFERENCE_LOOK: dict[str, tuple[str, object, str]] = {
    "mostpop": ("#8c510a", (0, (6, 2)), "MostPop"),                # brown, long dashes
    "centralised": ("#762a83", (0, (1, 1.5)), "centralised MF"),   # purple, dots
    "ease": ("#01665e", (0, (6, 2, 1, 2)), "EASE"),                 # teal, dash-dot
    "als": ("#c51b7d", (0, (3, 1, 1, 1, 1, 1)), "ALS"),            # magenta, dash-dot-dot
}
CHANCE_LOOK = ("0.45", (0, (1, 3)), "chance")  # grey, sparse dots: a random ranking
#: a baseline not in REFERENCE_LOOK (a new one) still gets a look of its own
SPARE_LOOKS = (("#b35806", (0, (4, 1, 4, 3))), ("#542788", (0, (2, 2))))


def reference_look(variant: str, i: int = 0) -> tuple[str, object, str]:
    """(colour, dash pattern, display name) of a non-private baseline's line."""
    from fedem_private.experiments.floors import method_of

    method = method_of(variant)
    if method in REFERENCE_LOOK:
        return REFERENCE_LOOK[method]
    color, style = SPARE_LOOKS[i % len(SPARE_LOOKS)]
    return color, style, method


def reference_lines(ax: plt.Axes, refs: pd.DataFrame, column: str
                    ) -> list[tuple[float, str, str]]:
    """A horizontal line per non-private baseline (mean over seeds), each in its own colour
    and dash pattern (:data:`REFERENCE_LOOK`). Returns (value, text, colour) of the labels
    :func:`end_labels` writes at the lines' right ends (after the panel's limits are set)."""
    ends = []
    for i, (_, r) in enumerate(refs.sort_values("variant").iterrows()):
        value = r[f"{column}_mean"]
        if isinstance(value, float) and math.isnan(value):
            continue
        color, style, name = reference_look(str(r["variant"]), i)
        ax.axhline(value, color=color, linestyle=style, linewidth=1.4, label=name,
                   zorder=REFERENCE_ZORDER)
        ends.append((float(value), f"{name} {value:.3g}", color))
    return ends


def chance_line(ax: plt.Axes, value: float) -> tuple[float, str, str]:
    """The random ranking's HR@10 as a horizontal line; its end label, as reference_lines."""
    color, style, name = CHANCE_LOOK
    ax.axhline(value, color=color, linestyle=style, linewidth=1.2,
               label=f"{name} (random ranking)", zorder=REFERENCE_ZORDER)
    return value, f"{name} {value:.3g}", color


def end_labels(ax: plt.Axes, ends: Sequence[tuple[float, str, str]]) -> None:
    """Write each horizontal line's name and value just outside the panel's right edge, at
    its height; labels that would overlap are pushed apart (at least 9 points), keeping
    their order. Call after the panel's y limits are final."""
    if not ends:
        return
    y0, y1 = ax.get_ylim()
    height = max(ax.get_window_extent().height, 1.0)  # the panel's height in points (dpi 72)
    per_point = (y1 - y0) / height * ax.figure.dpi / 72.0
    placed: list[float] = []
    for value, text, color in sorted(ends):
        y = value if not placed else max(value, placed[-1] + 9 * per_point)
        placed.append(y)
        ax.annotate(text, (1.0, y), xycoords=("axes fraction", "data"),
                    xytext=(3, 0), textcoords="offset points", fontsize=7, color=color,
                    va="center", annotation_clip=False)


#: the horizontal references' (chance, MostPop, the ceilings) drawing order: under every
#: curve, so that DP-MostPop's points, which approach MostPop at large eps, stay on top
REFERENCE_ZORDER = 1.5
#: DP-MostPop's curves: above the model curves too, in markers no reference line has
#: (filled diamonds, squares, ...; a cross on MostPop's dashed line hid in it, issue 80)
FLOOR_ZORDER = 3.0
FLOOR_MARKERS = ("D", "s", "^", "v")


def floor_lines(floors: pd.DataFrame) -> list[Line]:
    """One dashed grey line per DP-MostPop architecture (its row's mode), drawn above the
    horizontal references and the models (:data:`FLOOR_ZORDER`) in filled markers of its
    own (:data:`FLOOR_MARKERS`)."""
    from fedem_private.experiments.floors import FLOOR_LABEL

    out = []
    for i, mode in enumerate(sorted(floors["mode"].unique())):
        pts = floors[floors["mode"] == mode]
        out.append(Line(f"DP-MostPop · {FLOOR_LABEL.get(mode, mode)}", f"{0.25 + 0.2 * i:.2f}",
                        "--", FLOOR_MARKERS[i % len(FLOOR_MARKERS)], pts,
                        zorder=FLOOR_ZORDER, markersize=7.0))
    return out


def attack_figure(agg: pd.DataFrame, dataset: str, attacks: Sequence[str], path: Path,
                  n_seeds: str) -> Path:
    """Attack AUC against epsilon, one panel per attack (a row per architecture)."""
    rows = _panel_rows(agg)
    fig, axes = plt.subplots(len(rows), len(attacks),
                             figsize=(max(8.0, 5.5 * len(attacks)), 4.4 * len(rows)),
                             squeeze=False)
    for row, (mode, all_lines, axis) in zip(axes, rows, strict=True):
        for ax, attack in zip(row, attacks, strict=True):
            _plot_vs_eps(ax, all_lines, axis, f"{attack}_auc")
            ax.axhline(0.5, color="0.4", linestyle=":", linewidth=1, label="random guess (0.5)")
            ax.set_ylim(min(ax.get_ylim()[0], 0.45), 1.03)
            ax.set_title(_titled(mode, f"{attack_display(attack)} attack (last recorded "
                                       "round)"))
            ax.set_ylabel("attack AUC (further from 0.5 = more leakage)")
        legend(row[0], 8)
    fig.suptitle(f"{dataset}: attack success vs privacy budget ({_over(n_seeds)})")
    return _save(fig, path)


def _over(n_seeds: str) -> str:
    return "one seed" if n_seeds == "1" else f"mean ± std over {n_seeds} seeds"


def _eps_text(key: float | str) -> str:
    return ("ε=∞" if key == CLIP_ONLY else "no DP") if isinstance(key, str) else f"ε={key:g}"


#: the baselines the frontier draws on its accuracy axis (beside chance): a private model
#: is worth its leakage only above what popularity gives without any user's private data
FRONTIER_REFERENCES = ("mostpop",)


def frontier_figure(agg: pd.DataFrame, dataset: str, attacks: Sequence[str], path: Path,
                    n_seeds: str, references: pd.DataFrame | None = None,
                    random_full: float = 0.0) -> Path:
    """HR@10 (full) against attack AUC: the utility / privacy trade-off, one line per method
    (a row of panels per architecture, :func:`architectures`). The accuracy axis carries
    chance (``random_full``, when above 0) and MostPop (from ``references``, the seed-
    aggregated baseline rows) as labelled horizontal lines.

    The x axis is the AUC in the attacker's better orientation, max(AUC, 1 - AUC): an AUC
    of 0.1 means the score ranks members below non-members, and a server that knows the
    sign (one bit, e.g. from a canary) flips it and has AUC 0.9. Without the fold, a
    reversed attack would sit on the "private" side of the plot.
    """
    rows = _panel_rows(agg)
    fig, axes = plt.subplots(len(rows), len(attacks),
                             figsize=(max(8.0, 5.5 * len(attacks)), 4.8 * len(rows)),
                             squeeze=False)
    from fedem_private.experiments.floors import method_of

    refs = (references[references["variant"].map(method_of).isin(FRONTIER_REFERENCES)]
            if references is not None and not references.empty else None)
    for row, (mode, all_lines, axis) in zip(axes, rows, strict=True):
        _frontier_row(row, all_lines, axis, attacks, mode, refs, random_full)
    fig.suptitle(f"{dataset}: utility vs attack success ({_over(n_seeds)})")
    return _save(fig, path)


def _frontier_row(row: Sequence[plt.Axes], all_lines: list[Line], axis: EpsAxis,
                  attacks: Sequence[str], mode: str | None,
                  refs: pd.DataFrame | None = None, random_full: float = 0.0) -> None:
    for ax, attack in zip(row, attacks, strict=True):
        col = f"{attack}_auc"
        labels: list[tuple[int, str, np.ndarray, np.ndarray, list[str]]] = []
        for i, line in enumerate(all_lines):
            pts = _ordered(line.points, axis)
            pts = pts[pts[f"{col}_mean"].notna() & pts["hr10_full_mean"].notna()]
            if pts.empty:
                continue
            raw, y = pts[f"{col}_mean"].to_numpy(), pts["hr10_full_mean"].to_numpy()
            x = oriented_auc(raw)
            ax.plot(x, y, color=line.color, linestyle=line.style, alpha=0.7)
            ax.errorbar(x, y, xerr=pts[f"{col}_std"].fillna(0), yerr=pts["hr10_full_std"].fillna(
                0), fmt=line.marker, color=line.color, capsize=3, label=line.label,
                markerfacecolor=line.face)
            labels.append((i, line.color, x, y, [_eps_text(k) for k in pts["x_key"]]))
        ax.axvline(0.5, color="0.4", linestyle=":", linewidth=1, label="random guess (AUC 0.5)")
        ends = [chance_line(ax, random_full)] if random_full > 0 else []
        if refs is not None:
            ends += reference_lines(ax, refs, "hr10_full")
        ax.set_xlim(0.45, 1.06)
        ax.set_ylim(bottom=0)
        end_labels(ax, ends)
        _label_points(ax, labels)
        ax.set_xlabel(f"{attack_display(attack)} attack AUC, better orientation: "
                      "max(AUC, 1 - AUC)")
        ax.set_ylabel("HR@10, full ranking")
        ax.set_title(_titled(mode, f"{attack_display(attack)}: better is up and to the "
                                   "left"))
        ax.grid(alpha=0.3)
    # lower right (leaky and no better than chance) is where a frontier rarely has points;
    # "best" put the legend over the no-noise points at the top right
    legend(row[0], 8, loc="lower right")


def bytes_figure(agg: pd.DataFrame, dataset: str, path: Path, n_seeds: str) -> Path:
    """HR@10 (full) against bytes uploaded per client per round: a panel per protocol and
    privacy mechanism.

    For runs that differ in upload codec (FedPEFT, docs/design.md section 11): x is the
    last round's upload (the codec's steady state, after its warm-up; log
    scale), colour the method (``variant`` without its ``~codec``), marker the
    codec, and each point is labelled with its epsilon when any run is private.
    Each mechanism has its own panels (the non-private runs sit with every
    private mechanism's), so one epsilon label never stands for two mechanisms.
    """
    private_modes: list[str | None] = sorted({str(m) for m in agg["mode"] if not _plain(m)})
    panels = [(protocol, mode) for protocol in sorted(agg["protocol"].unique())
              for mode in (private_modes or [None])]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 5.8 * len(panels)), 4.6),
                             squeeze=False)
    methods = sorted({str(v).split("~")[0] for v in agg["variant"]})
    codecs = sorted({str(c) for c in agg["codec"]}) if "codec" in agg else ["full"]
    private = bool(private_modes)
    for ax, (protocol, mode) in zip(axes[0], panels, strict=True):
        sub = agg[(agg["protocol"] == protocol) & ((agg["mode"] == mode) | _plain_rows(agg))]
        for (variant, key), rows in sub.groupby(["variant", "x_key"], sort=True):
            method = str(variant).split("~")[0]
            codec = str(rows["codec"].iloc[0]) if "codec" in rows else "full"
            x, y = rows["bytes_up_last_mean"].to_numpy(), rows["hr10_full_mean"].to_numpy()
            ax.errorbar(x, y, yerr=rows["hr10_full_std"].fillna(0).to_numpy(),
                        fmt=MARKERS[codecs.index(codec) % len(MARKERS)],
                        color=f"C{methods.index(method) % 10}", capsize=3, markersize=7,
                        label=f"{variant_display(method)} · {codec}"
                        + (f" · {_eps_text(key)}" if private else ""))
            if private:
                ax.annotate(_eps_text(key), (x[0], y[0]), xytext=(5, 3),
                            textcoords="offset points", fontsize=7)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("bytes uploaded per client per round (last round, log scale)")
        ax.set_ylabel("HR@10, full ranking")
        ax.set_title(f"protocol {protocol}" + (f" · {mode}" if private else ""))
        ax.grid(alpha=0.3, which="both")
        handles, labels = ax.get_legend_handles_labels()
        seen = dict(zip(labels, handles, strict=True))
        legend(ax, 7, list(seen.values()), list(seen.keys()))
    fig.suptitle(f"{dataset}: utility vs upload size ({_over(n_seeds)})")
    return _save(fig, path)


def oriented_auc(auc: np.ndarray) -> np.ndarray:
    """max(AUC, 1 - AUC): the AUC of the attack or of its reversed score, whichever leaks more."""
    auc = np.asarray(auc, dtype=np.float64)
    return np.maximum(auc, 1.0 - auc)


def _label_points(ax: plt.Axes, labels: list[tuple[int, str, np.ndarray, np.ndarray, list[str]]]
                  ) -> None:
    """Write each point's epsilon beside it, once per cluster of coinciding points.

    Points that coincide (within 3% of the x range and 4% of the y range) share one label:
    in the line's colour when they all belong to one line, in grey when several lines
    meet there (typically every method at chance under strong noise).
    """
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    clusters: list[dict] = []
    for i, color, xs, ys, texts in labels:
        for x, y, text in zip(xs, ys, texts, strict=True):
            near = next((c for c in clusters if abs(c["x"] - x) < 0.03 * (x1 - x0)
                         and abs(c["y"] - y) < 0.04 * (y1 - y0)), None)
            if near is None:
                clusters.append({"x": x, "y": y, "lines": {i: color}, "texts": [text]})
            else:
                near["lines"][i] = color
                if text not in near["texts"]:
                    near["texts"].append(text)
    renderer = ax.figure.canvas.get_renderer()
    placed: list[object] = []  # the window extents of the labels written so far
    for c in clusters:
        (i, color), *others = c["lines"].items()
        shared = bool(others)
        text = _join_eps(c["texts"]) + (" (several methods)" if shared else "")
        first = LABEL_OFFSETS.index((6, 4 - 11 * (i % 2) * (not shared)))
        for offset in LABEL_OFFSETS[first:] + LABEL_OFFSETS[:first]:
            note = ax.annotate(text, (c["x"], c["y"]), xytext=offset,
                               textcoords="offset points", fontsize=7,
                               color="0.3" if shared else color,
                               ha="left" if offset[0] >= 0 else "right")
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            note.remove()  # it would cover a label already written: try the next place
        else:  # no place is free: the first, over the others, rather than none
            note = ax.annotate(text, (c["x"], c["y"]), xytext=LABEL_OFFSETS[first],
                               textcoords="offset points", fontsize=7,
                               color="0.3" if shared else color)
            box = note.get_window_extent(renderer)
        placed.append(box)


#: where a point's eps label may go (points right and up of it; a negative x puts it on the
#: left, right-aligned), in the order tried: beside the point, then further above and below
LABEL_OFFSETS = [(6, 4), (6, -7), (-6, 4), (-6, -7), (6, 14), (6, -18), (-6, 14), (-6, -18),
                 (6, 24), (6, -28), (-6, 24), (-6, -28)]


def _join_eps(texts: list[str]) -> str:
    """["ε=1", "ε=4", "no DP"] -> "ε=1, 4, no DP": one ε= prefix for the numbers."""
    nums = sorted((t[2:] for t in texts if t.startswith("ε=")),
                  key=lambda n: float(n.replace("∞", "inf")))
    rest = [t for t in texts if not t.startswith("ε=")]
    return ", ".join(([f"ε={', '.join(nums)}"] if nums else []) + rest)


# a legend of more entries than this goes below its panel, where it covers no data
LEGEND_INSIDE_MAX = 6


def legend(ax: plt.Axes, fontsize: int, handles: list | None = None,
           labels: list[str] | None = None, loc: str = "best") -> None:
    """The panel's legend: inside it (where it covers least) when short, else below it, in
    columns, so that a sweep of many settings does not hide its own lines."""
    if handles is None or labels is None:
        handles, labels = ax.get_legend_handles_labels()
    if len(labels) <= LEGEND_INSIDE_MAX:
        ax.legend(handles, labels, fontsize=fontsize, loc=loc)
        return
    below = ax.legend(handles, labels, fontsize=fontsize, loc="upper center", frameon=False,
                      bbox_to_anchor=(0.5, -0.3), ncol=2 if len(labels) > LEGEND_INSIDE_MAX else 1)
    spec = ax.get_subplotspec()
    # in the last row the panels keep their size and the saved image grows instead; above
    # it the layout makes room, so the legend does not run into the next row
    below.set_in_layout(spec is not None and not spec.is_last_row())


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    below = [leg for ax in fig.axes if (leg := ax.get_legend()) is not None
             and not leg.get_in_layout()]  # legends below their panels (see legend)
    fig.savefig(tmp, dpi=120, format="png", bbox_inches="tight",
                bbox_extra_artists=[*fig.axes, *fig.legends, *fig.texts, *below])
    plt.close(fig)
    tmp.replace(path)
    return path

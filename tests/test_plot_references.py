"""The report's plots (issue 67): the points past the epsilon axis's break stand alone, the
frontier carries chance and MostPop on its accuracy axis, and no two reference lines look
alike."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedem_private.experiments import report_plots as rp


def _row(variant, mode, eps, hr, auc=0.6):
    return {"dataset": "d", "protocol": "strict", "variant": variant, "mode": mode,
            "eps_target": eps, "n_seeds": 3,
            "x_key": rp.x_key(mode, eps, math.nan),
            "hr10_full_mean": hr, "hr10_full_std": 0.01,
            "hr10_sampled_mean": hr * 2, "hr10_sampled_std": 0.01,
            "projection_auc_mean": auc, "projection_auc_std": 0.01}


def _agg():
    rows = [_row(v, "cdp-gaussian", eps, hr) for v, base in (("fedmf", 0.4), ("fedem", 0.05))
            for eps, hr in ((1.0, base * 0.6), (8.0, base * 0.8), (math.inf, base))]
    rows += [_row("mostpop", "none", math.inf, 0.226, math.nan),
             _row("centralised", "none", math.inf, 0.46, math.nan),
             _row("ease [ease_lambda=500]", "none", math.inf, 0.74, math.nan),
             _row("dp-mostpop", "central-gaussian", 1.0, 0.229, math.nan),
             _row("dp-mostpop", "central-gaussian", 8.0, 0.229, math.nan)]
    return pd.DataFrame(rows)


@pytest.fixture
def figures(monkeypatch):
    kept = []

    def keep(fig, path):
        fig.canvas.draw()  # lay out, as saving would
        kept.append(fig)
        return path

    monkeypatch.setattr(rp, "_save", keep)
    return kept


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_no_segment_crosses_the_axis_break_to_the_clip_only_point(figures):
    """Before, a faint dotted segment joined eps 8 to 'inf (clip only)', which reads as
    measured values in between; the clip-only point is now a marker of its own."""
    agg = _agg()
    rp.utility_figure(agg, "d", None, 0.033, "3")
    (fig,) = figures
    axis = rp.EpsAxis(list(agg["x_key"]))
    assert axis.separator is not None
    for ax in fig.axes:
        # segments in data coordinates (the horizontal references span the panel in axes
        # coordinates, the break marks sit on the spines): none reaches past the break
        joined = [line for line in ax.lines if len(line.get_xdata()) > 1
                  and line.get_linestyle() != "None" and line.get_transform() == ax.transData]
        assert joined, "the finite-eps curves are drawn"
        for line in joined:
            assert max(line.get_xdata()) < axis.separator, line.get_label()
        # the clip-only markers are still drawn, right of the break
        markers = [x for line in ax.lines for x in line.get_xdata()
                   if line.get_linestyle() == "None"]
        assert any(x > axis.separator for x in markers)


def test_the_frontier_draws_chance_and_mostpop_labelled(figures):
    agg = _agg()
    from fedem_private.experiments import floors

    rp.frontier_figure(floors.part(agg, "models"), "d", ["projection"], None, "3",
                       floors.part(agg, "references"), 0.033)
    (fig,) = figures
    (ax,) = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    assert "MostPop" in labels and "chance (random ranking)" in labels
    assert "EASE" not in labels  # the frontier's accuracy axis keeps chance and MostPop only
    heights = {line.get_label(): line.get_ydata()[0] for line in ax.lines
               if line.get_label() in ("MostPop", "chance (random ranking)")}
    assert heights == {"MostPop": pytest.approx(0.226), "chance (random ranking)": 0.033}
    assert "MostPop 0.226" in _texts(ax) and "chance 0.033" in _texts(ax)
    # without references the figure is as before: no MostPop
    figures.clear()
    rp.frontier_figure(floors.part(agg, "models"), "d", ["projection"], None, "3")
    assert "MostPop" not in figures[0].axes[0].get_legend_handles_labels()[1]


def test_each_reference_line_has_its_own_colour_dashes_and_end_label(figures):
    rp.utility_figure(_agg(), "d", None, 0.033, "3")
    ax = figures[0].axes[0]
    refs = {line.get_label(): line for line in ax.lines
            if line.get_label() in ("MostPop", "centralised MF", "EASE",
                                    "chance (random ranking)")}
    assert len(refs) == 4
    assert len({line.get_color() for line in refs.values()}) == 4  # four colours
    # and every look (the known baselines', chance's, the spare ones) has its own dashes
    patterns = [str(look[1]) for look in (*rp.REFERENCE_LOOK.values(), rp.CHANCE_LOOK,
                                          *rp.SPARE_LOOKS)]
    assert len(set(patterns)) == len(patterns)
    assert rp.reference_look("knn [k=5]")[2] == "knn"  # an unknown baseline: a spare look
    texts = _texts(ax)
    for text in ("MostPop 0.226", "centralised MF 0.46", "EASE 0.74", "chance 0.033"):
        assert text in texts


def test_end_labels_of_close_lines_do_not_overlap(figures):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_ylim(0, 1)
    rp.end_labels(ax, [(0.5, "a 0.5", "k"), (0.501, "b 0.501", "k"), (0.9, "c 0.9", "k")])
    fig.canvas.draw()
    boxes = sorted((t.get_window_extent() for t in ax.texts), key=lambda b: b.y0)
    assert [t.get_text() for t in sorted(ax.texts, key=lambda t: t.get_position()[1])] == [
        "a 0.5", "b 0.501", "c 0.9"]
    for low, high in zip(boxes, boxes[1:], strict=False):
        assert low.y1 <= high.y0 + 0.5
    plt.close(fig)

"""Issue 40, a newcomer's second pass: bad input is one line and exit 2, nothing is silently
misread or replaced."""

from __future__ import annotations

import errno
import os

import pytest

from fedem_private.cli import main
from fedem_private.data import load_dataset
from fedem_private.errors import UserError

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def one_line_error(capsys, needle: str) -> str:
    """The command's stderr, checked to be one line holding ``needle`` and no traceback."""
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------- 2: tracebacks become one line
@pytest.mark.parametrize("text,needle", [
    ("u1,i1\nu1,i2\nu1,i3\nu1,i4\n", "its only user (u1) interacted with every one of its 4"),
    ("u1,i1\nu1,i2\nu1,i3\nu2,i1\nu2,i2\nu2,i3\nu3,i1\nu3,i2\n",
     "2 of its 3 users (e.g. u1) interacted with every one of its 3 items"),
])
def test_a_user_with_every_item_is_a_one_line_error(tmp_path, capsys, text, needle):
    (tmp_path / "d.csv").write_text(text)
    out = tmp_path / "out"
    assert main(["run", "--dataset", "csv", "--data-dir", str(tmp_path / "d.csv"), *TINY,
                 "--out", str(out)]) == 2
    one_line_error(capsys, needle)
    assert not out.exists()


def test_run_into_a_folder_it_cannot_write_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """A read-only filesystem (or a folder without write permission): root ignores chmod, so
    the refusal is simulated where the run directory is made."""
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if ".tmp-" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    assert main(["run", *TINY, "--out", str(tmp_path / "run")]) == 2
    one_line_error(capsys, f"cannot write in {tmp_path}: Read-only file system")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ 3: CSV headers are read by name
def write_csv(tmp_path, text: str):
    path = tmp_path / "d.csv"
    path.write_text(text)
    return path


def test_csv_header_columns_are_read_by_name_in_any_order(tmp_path):
    rows = "item,user,rating\n10,1,5\n11,1,3\n10,2,4\n12,2,1\n"
    d = load_dataset("csv", write_csv(tmp_path, rows), min_rating=3)
    assert d.user_ids.tolist() == ["1", "2"] and d.item_ids.tolist() == ["10", "11"]
    d = load_dataset("csv", write_csv(tmp_path, "userId,movieId,timestamp\n1,10,5\n1,11,3\n"))
    assert d.item_ids.tolist() == ["10", "11"] and d.timestamps.tolist() == [5.0, 3.0]
    # no header: user,item[,rating][,timestamp] by position, as before
    d = load_dataset("csv", write_csv(tmp_path, "1,10,5\n1,11,3\n"), min_rating=4)
    assert d.item_ids.tolist() == ["10"]


@pytest.mark.parametrize("text,needle", [
    ("customer,product\n1,10\n1,11\n", "the first line 'customer,product' looks like a header"),
    ("customer,product\nann,x\nann,y\nbob,x\n", "names no known column"),
    ("a,b,score_of_it\n1,10,5\n", "looks like a header"),
    ("user,rating\n1,5\n2,3\n", "header 'user,rating' names no item column"),
    ("item,rating\n1,5\n", "names no user column"),
    ("user,item,genre\n1,10,x\n", "unknown column 'genre'"),
    ("user,item,item_id\n1,10,11\n", "names the item column twice"),
])
def test_csv_headers_that_are_not_understood_are_refused(tmp_path, capsys, text, needle):
    path = write_csv(tmp_path, text)
    with pytest.raises(UserError, match=None) as err:
        load_dataset("csv", path)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert main(["run", "--dataset", "csv", "--data-dir", str(path), *TINY,
                 "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, needle)


# ----------------------------------------------------- 4: nothing is silently replaced
@pytest.fixture
def swept(tmp_path):
    """A finished tiny sweep (two seeds, no attacks) and its root."""
    from sweep_helpers import write_spec

    from fedem_private.experiments.sweep import run_sweep

    spec = write_spec(tmp_path / "s.toml", 'methods = ["fedmf"]\nprivacy = ["none"]\n'
                      'seeds = [0, 1]')
    root = tmp_path / "sweep"
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    return spec, root


def test_report_into_another_report_needs_force_and_clears_its_old_plots(swept, tmp_path,
                                                                         capsys):
    _, root = swept
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.md").write_text("# old\n![gone](gone-chart.png)\n")
    (rep / "gone-chart.png").write_bytes(b"old plot")  # linked by the old report.md
    (rep / "ml-100k-hr10_vs_eps.png").write_bytes(b"old plot")  # a dataset no longer shown
    (rep / "notes.txt").write_text("mine")
    before = sorted(p.name for p in rep.iterdir())
    capsys.readouterr()
    assert main(["report", str(root), "--out", str(rep)]) == 2
    one_line_error(capsys, f"{rep} already holds a report (gone-chart.png, ml-100k-hr10_vs_eps"
                           ".png, report.md); pass --force")
    assert sorted(p.name for p in rep.iterdir()) == before
    assert (rep / "report.md").read_text().startswith("# old")
    assert main(["report", str(root), "--out", str(rep), "--force"]) == 0
    assert sorted(p.name for p in rep.iterdir()) == ["notes.txt", "report.md", "results.csv",
                                                     "synthetic-hr10_vs_eps.png"]


def test_a_source_folder_s_own_report_is_rewritten_without_stale_plots(swept, capsys):
    _, root = swept
    assert main(["report", str(root)]) == 0
    (root / "old-dataset-frontier.png").write_bytes(b"from a dataset since removed")
    assert main(["report", str(root)]) == 0  # its own report: no --force needed
    assert not (root / "old-dataset-frontier.png").exists()
    assert (root / "synthetic-hr10_vs_eps.png").is_file()


def test_sweep_force_removes_the_old_report(swept, capsys):
    from fedem_private.experiments.sweep import run_sweep

    spec, root = swept
    assert main(["report", str(root)]) == 0
    assert (root / "report.md").is_file() and (root / "synthetic-hr10_vs_eps.png").is_file()
    capsys.readouterr()
    assert run_sweep(str(spec), str(root), jobs=1, force=True, progress=False) == 0
    assert "removed the old report (report.md, synthetic-hr10_vs_eps.png)" in \
        capsys.readouterr().out
    assert not (root / "report.md").exists() and not list(root.glob("*.png"))
    assert (root / "results.csv").is_file()  # the sweep's own table, rewritten


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch,
                                                                  capsys):
    from pathlib import Path

    from fedem_private import api
    from fedem_private.simulation import loop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "default_out", lambda cfg: Path("runs") / "synthetic-fedmf-now")
    assert main(["run", *TINY]) == 0
    assert main(["run", *TINY]) == 0
    assert "wrote runs/synthetic-fedmf-now-2" in capsys.readouterr().out
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["synthetic-fedmf-now",
                                                      "synthetic-fedmf-now-2"]
    assert all((p / "summary.json").is_file() for p in runs.iterdir())

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.Simulation, "step", interrupted)
    assert main(["run", *TINY]) == 130  # the name it reserved is freed
    assert sorted(p.name for p in runs.iterdir()) == ["synthetic-fedmf-now",
                                                      "synthetic-fedmf-now-2"]
    (tmp_path / "fresh").mkdir()
    monkeypatch.chdir(tmp_path / "fresh")
    assert main(["run", *TINY]) == 130  # and runs/, when it was made for that run
    assert list((tmp_path / "fresh").iterdir()) == []


# ------------------------------------------------------------------------------ 6: sweeps
def test_a_sweep_where_every_point_fails_exits_1_and_says_so(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("u1,i1\nu1,i2\nu1,i3\n")  # one user with every item
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\ndatasets = ["csv"]\nmethods = ["fedmf"]\nseeds = [0, 1]\n'
                    f'[sweep.data_dirs]\ncsv = "{tmp_path / "d.csv"}"\n'
                    "[base.train]\nrounds = 1\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "0 ran, 0 already done, 2 failed" in out
    assert "sweep: every run to do failed (2 of 2)" in out


def test_a_data_folder_without_the_dataset_s_file_stops_the_sweep_up_front(tmp_path, capsys):
    (tmp_path / "ml").mkdir()  # exists, but holds no u.data
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\ndatasets = ["ml-100k"]\nmethods = ["fedmf"]\nseeds = [0, 1]\n'
                    f'[sweep.data_dirs]\nml-100k = "{tmp_path / "ml"}"\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    one_line_error(capsys, f"file not found: {tmp_path / 'ml' / 'u.data'}: 2 runs of")
    assert not (tmp_path / "o").exists()


def test_a_base_data_dir_no_point_reads_is_refused(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\ndatasets = ["ml-100k"]\nmethods = ["fedmf"]\n'
                    '[base.data]\ndata_dir = "data/ml-100k"\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    one_line_error(capsys, "[base.data] data_dir 'data/ml-100k' belongs to [base.data] dataset "
                           "(synthetic), which is not among the sweep's datasets (ml-100k)")
    # where the base dataset is swept, its data_dir is the one used
    from fedem_private.experiments.sweep_spec import grid, load_spec

    spec.write_text('[sweep]\ndatasets = ["ml-100k"]\nmethods = ["fedmf"]\n'
                    '[base.data]\ndataset = "ml-100k"\ndata_dir = "data/ml-100k"\n')
    assert [p.config.data.data_dir for p in grid(load_spec(spec))] == ["data/ml-100k"]


def test_budget_less_modes_accept_epsilons_inf_but_not_a_finite_budget(tmp_path):
    from fedem_private.experiments.sweep_spec import grid, load_spec

    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nprivacy = ["none"]\nepsilons = [inf]\n')
    assert [p.name.split("/")[2] for p in grid(load_spec(spec))] == ["none"]
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nprivacy = ["none"]\nepsilons = [inf, 8]\n')
    with pytest.raises(UserError, match="epsilons needs an ldp privacy mode"):
        load_spec(spec)


def test_the_documented_sweep_file_is_valid():
    """docs/sweeps.md's example parses into the grid it says (36 runs)."""
    import re
    import tomllib
    from pathlib import Path

    from fedem_private.experiments.sweep_spec import grid, parse_spec

    doc = (Path(__file__).parents[1] / "docs" / "sweeps.md").read_text()
    block = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    points = grid(parse_spec(tomllib.loads(block), "docs/sweeps.md"))
    assert len(points) == 36 and "36 runs" in doc
    assert {p.config.data.data_dir for p in points if p.name.startswith("ml-100k/")} == {
        "data/ml-100k"}


# ------------------------------------------------------------------------ 7: offline data
def test_a_failed_download_suggests_the_offline_ways_and_leaves_no_cache(tmp_path, capsys):
    cache = tmp_path / "new" / "cache"
    assert main(["datasets", "download", "ml-100k", "--cache-dir", str(cache),
                 "--url", f"file://{tmp_path}/missing.zip"]) == 2
    err = one_line_error(capsys, "download from file://")
    assert "--url file:///path/to/ml-100k.zip" in err and "--data-dir" in err
    assert list(tmp_path.iterdir()) == []  # neither cache folder was left behind


def test_an_archive_from_a_file_url_lands_in_the_cache_dir_that_list_shows(tmp_path, capsys,
                                                                           monkeypatch):
    import zipfile

    archive = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ml-100k/u.data", "1\t1\t5\t1\n1\t2\t5\t2\n")
        zf.writestr("ml-100k/u.user", "1|20|F|x|1\n")
    from fedem_private.data import download as dl

    monkeypatch.setitem(dl.REGISTRY, "ml-100k", dl.Source(dl.REGISTRY["ml-100k"].url,
                                                          {"u.data": None, "u.user": None}))
    cache = tmp_path / "cache"
    assert main(["datasets", "download", "ml-100k", "--url", f"file://{archive}",
                 "--cache-dir", str(cache)]) == 0
    assert (cache / "ml-100k" / "u.data").is_file()
    capsys.readouterr()
    assert main(["datasets", "list", "--cache-dir", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache: {cache} (--cache-dir, or $FEDEM_PRIVATE_CACHE)"
    assert f"ml-100k    cached at {cache / 'ml-100k'}" in lines
    monkeypatch.setenv("FEDEM_PRIVATE_CACHE", str(tmp_path / "elsewhere"))
    assert main(["datasets", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"cache: {tmp_path / 'elsewhere'} ")


# --------------------------------------------------------------------------- 9: smaller
def test_version_flag_prints_the_package_version(capsys):
    from fedem_private import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedem-private {__version__}"


def test_run_help_lists_the_flags_under_headings(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help-all"])  # --help: the same headings, the common flags only
    text = capsys.readouterr().out
    headings = ["data and evaluation protocol:", "training:",
                "federation: method, parts, aggregation, merging, uploads:", "privacy:",
                "output and recording:"]
    at = [text.index(f"\n{h}\n") for h in headings]
    assert at == sorted(at)

    def section(flag: str) -> str:
        where = text.index(f"\n  {flag} ")
        return max((h for h, i in zip(headings, at, strict=True) if i < where),
                   key=lambda h: at[headings.index(h)])

    assert section("--dataset") == section("--first-seen-order") == headings[0]
    assert section("--rounds") == headings[1] and section("--method") == headings[2]
    assert section("--epsilon") == section("--clip") == headings[3]
    assert section("--out") == section("--record-rounds") == headings[4]


@pytest.mark.parametrize("argv,needle", [
    (["sweep", "--jobs", "-1"], "argument --jobs: -1 is negative; give 0 for one job per CPU"),
    (["sweep", "--jobs", "two"], "argument --jobs: not an integer: 'two'"),
])
def test_negative_jobs_are_refused(tmp_path, capsys, argv, needle):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, needle)
    assert not (tmp_path / "o").exists()


def test_negative_jobs_are_refused_by_the_api_too(tmp_path):
    from fedem_private.experiments.sweep import run_sweep

    with pytest.raises(UserError, match="jobs must be 0 .* or more, got -1"):
        run_sweep(None, str(tmp_path / "o"), jobs=-1, progress=False)
    assert not (tmp_path / "o").exists()


def test_a_directory_given_as_a_config_file_is_named_as_such(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path), *TINY]) == 2
    one_line_error(capsys, f"config file {tmp_path} is a directory; name a TOML file")
    assert main(["sweep", str(tmp_path)]) == 2
    one_line_error(capsys, f"sweep file {tmp_path} is a directory")


def test_the_public_api_is_listed():
    import fedem_private as fp

    assert set(fp.__all__) == {"__version__", "run", "sweep", "attack", "load_results",
                               "load_run", "resolve_config", "Result", "RunWarning"}
    assert set(fp.__all__) <= set(dir(fp))
    assert all(callable(getattr(fp, name)) for name in fp.__all__ if name != "__version__")


# ------------------------------------------------------- 5: the demo does not warn about itself
@pytest.mark.parametrize("mode", ["ldp-laplace", "ldp-gaussian"])
def test_an_ldp_run_without_a_chosen_clip_is_refused(tmp_path, capsys, mode):
    out = tmp_path / "o"
    assert main(["run", "--privacy", mode, "--epsilon", "8", *TINY, "--out", str(out)]) == 2
    one_line_error(capsys, f"--privacy {mode} clips each upload to --clip C, and the built-in "
                           "C = 1 would clip every one")
    assert not out.exists()
    config = tmp_path / "c.toml"  # a clip chosen in the config file counts
    config.write_text(f'[privacy]\nmode = "{mode}"\nepsilon = 8.0\nclip = 50.0\n')
    assert main(["run", "--config", str(config), *TINY, "--out", str(out)]) == 0


def test_the_python_api_warns_as_the_command_does(tmp_path, capsys):
    import warnings

    import fedem_private as fp

    cfg = {"train": {"rounds": 2, "local_epochs": 1, "dim": 4},
           "privacy": {"mode": "ldp-laplace", "epsilon": 8.0, "clip": 0.01}}
    with pytest.warns(fp.RunWarning, match=r"of uploads were clipped"):
        res = fp.run(cfg, out=tmp_path / "a")
    assert res.summary["clipping"]["warning"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp.run(cfg, out=tmp_path / "b", warn=False)
    # the command prints it once, as its own line, not also as a Python warning
    assert main(["run", *TINY, "--privacy", "ldp-laplace", "--epsilon", "8", "--clip", "0.01",
                 "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert err.count("of uploads were clipped") == 1 and "RunWarning" not in err


def test_the_readme_fedrap_command_names_its_dataset():
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    commands = re.sub(r"\\\n\s*", " ", readme)  # join continued lines
    fedrap = [line for line in commands.splitlines() if "--method fedrap" in line]
    assert fedrap and all("--dataset ml-100k" in line for line in fedrap)


# ------------------------------------------------------------- 8: plots with many settings
def _agg(variants: list[str]):
    """A seed-aggregated table as report.aggregate makes it: each variant clip-only and at
    eps 1 and 8, on one dataset."""
    import pandas as pd

    rows = []
    for i, v in enumerate(variants):
        for eps in (1.0, 8.0, float("inf")):
            x = "inf (clip only)" if eps == float("inf") else eps
            rows.append({"dataset": "d", "protocol": "strict", "variant": v,
                         "mode": "ldp-laplace", "eps_target": eps, "x_key": x,
                         "hr10_full_mean": 0.2 + 0.01 * i, "hr10_full_std": 0.01,
                         "hr10_sampled_mean": 0.3 + 0.01 * i, "hr10_sampled_std": 0.01})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("n", [3, 15])
def test_a_long_legend_sits_below_its_panel(tmp_path, n):
    """rp.legend (the attack and frontier panels'): inside a panel when short, else below it,
    under its ticks and label."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from fedem_private.experiments import report_plots as rp

    fig, ax = plt.subplots()
    for i in range(n):
        ax.plot([0, 1], [i, i + 1], label=f"method{i}")
    ax.set_xlabel("x")
    rp.legend(ax, 8)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box, leg = ax.get_window_extent(), ax.get_legend().get_window_extent()
    inside = leg.y1 > box.y0 and leg.y0 < box.y1 and leg.x1 > box.x0 and leg.x0 < box.x1
    assert inside == (n <= rp.LEGEND_INSIDE_MAX)
    if not inside:  # below the axis, its ticks and its label too
        assert leg.y1 <= ax.xaxis.get_tightbbox(renderer).y0
    plt.close(fig)


@pytest.mark.parametrize("n", [3, 15])
def test_the_utility_figure_has_one_legend_below_every_panel(tmp_path, monkeypatch, n):
    from fedem_private.experiments import report_plots as rp

    figures = []
    real_save = rp._save
    monkeypatch.setattr(rp, "_save", lambda fig, path: (figures.append(fig),
                                                        real_save(fig, path))[1])
    rp.utility_figure(_agg([f"method{i}" for i in range(n)]), "d", tmp_path / "u.png", 0.01,
                      "3")
    (fig,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the saved figure was closed: draw it again
    canvas.draw()
    renderer = canvas.get_renderer()
    (leg,) = fig.legends
    assert len(leg.get_texts()) == n + 1  # n lines + the random baseline, each once
    top = leg.get_window_extent().y1
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert top <= ax.xaxis.get_tightbbox(renderer).y0
    assert (tmp_path / "u.png").stat().st_size > 0


def test_a_label_names_only_the_settings_its_variant_varies_in():
    import pandas as pd

    from fedem_private.experiments.report import split_settings

    rows = []
    for variant, rounds, clip in [("fedmf", 10, 5.0), ("fedmf", 20, 5.0),
                                  ("fedem-em", 10, 5.0), ("fedem-em", 10, 9.0)]:
        for seed in (0, 1):
            rows.append({"dataset": "d", "protocol": "strict", "variant": variant,
                         "mode": "ldp-laplace", "eps_target": 8.0, "seed": seed,
                         "config_id": f"{variant}{rounds}{clip}",
                         "cfg.train.rounds": rounds, "cfg.privacy.clip": clip})
    out, split = split_settings(pd.DataFrame(rows))
    assert split == ["cfg.train.rounds", "cfg.privacy.clip"]
    assert sorted(set(out["variant"])) == ["fedem-em [clip=5]", "fedem-em [clip=9]",
                                           "fedmf [rounds=10]", "fedmf [rounds=20]"]


def test_a_setting_left_out_at_its_default_is_labelled_with_its_value():
    """A run's identity leaves later fields out while they hold their default (ALS's alpha
    of 1 here): the label shows that value, not "default"; a None setting stays
    "default"."""
    import pandas as pd

    from fedem_private.experiments.report import split_settings

    rows = []
    for alpha, factors in [(None, None), (10.0, 32)]:
        for seed in (0, 1):
            rows.append({"dataset": "d", "protocol": "strict", "variant": "als",
                         "mode": "none", "eps_target": None, "seed": seed,
                         "config_id": f"als{alpha}", "cfg.baseline.als_alpha": alpha,
                         "cfg.baseline.als_factors": factors})
    out, _ = split_settings(pd.DataFrame(rows))
    assert sorted(set(out["variant"])) == ["als [als_alpha=1, als_factors=64]",
                                           "als [als_alpha=10, als_factors=32]"]


# ------------------------------------------------------------- 10: list, and run --dry-run
def test_list_names_every_preset_and_part_one_line_each(capsys):
    from fedem_private.models import BACKBONES
    from fedem_private.privacy.config import MODES
    from fedem_private.simulation.config import (
        AGGREGATIONS,
        BASELINE_METHODS,
        CODECS,
        FEDERATED_METHODS,
        MERGES,
    )

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [tuple(line.split()[:2]) for line in lines]
    for kind, names in (("method", FEDERATED_METHODS), ("baseline", BASELINE_METHODS),
                        ("backbone", BACKBONES), ("merge", MERGES),
                        ("aggregation", AGGREGATIONS), ("codec", CODECS), ("privacy", MODES)):
        assert [n for k, n in listed if k == kind] == list(names), kind
    fedem = next(line for line in lines if line.split()[:2] == ["method", "fedem"])
    assert "backbone mf, aggregation similarity, merge em" in fedem


def test_list_imports_no_heavy_library():
    import json
    import subprocess
    import sys

    code = ("import json, sys, contextlib, io\nfrom fedem_private.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['list'])\n"
            "print(json.dumps([rc, [m for m in ('torch', 'pandas', 'matplotlib') "
            "if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == [0, []]


def test_dry_run_prints_the_resolved_config_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from fedem_private.simulation.config import load_toml, to_dict

    monkeypatch.chdir(tmp_path)
    assert main(["run", "--method", "fedem", "--rounds", "3", "--dry-run",
                 "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    (tmp_path / "printed.toml").write_text(text)
    cfg = load_toml(tmp_path / "printed.toml")
    assert cfg.train.rounds == 3 and cfg.federation.method == "fedem"
    assert cfg.federation.merge == "em" and cfg.federation.aggregation == "similarity"
    assert to_dict(cfg) == to_dict(cfg.validate().resolved())  # already resolved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["printed.toml"]
    assert main(["run", "--rounds", "0", "--dry-run"]) == 2  # still validated


# ---------------------------------------- 5: a model that diverged is not a mis-set clip
def _history(norms: list[float], frac: float, noise: float):
    from types import SimpleNamespace

    return [SimpleNamespace(privacy={"frac_clipped": frac, "mean_pre_clip_norm": n,
                                     "clip": 800.0, "noise_scale": noise}) for n in norms]


def test_a_run_whose_norm_blew_up_under_noise_is_said_to_have_diverged():
    from fedem_private.experiments.runner import clipping_summary

    diverged = clipping_summary(_history([880.0, 5e4, 1.2e7], 0.93, 200.0))["warning"]
    assert "not for want of a larger clip" in diverged and "diverged under the noise" in diverged
    assert "1.36e+04-fold" in diverged
    # the same share clipped with a steady norm (or without noise) is a clip to reconsider
    for history in (_history([3000.0, 3100.0, 3200.0], 0.93, 200.0),
                    _history([880.0, 5e4, 1.2e7], 0.93, 0.0)):
        warning = clipping_summary(history)["warning"]
        assert "clipping discarded most of each update" in warning and "diverged" not in warning


def test_the_report_lists_diverged_settings_apart_from_mis_set_clips():
    import pandas as pd

    from fedem_private.experiments.report import clipping_notes, diverged_notes

    base = {"dataset": "synthetic", "protocol": "strict", "variant": "fedem-em",
            "mode": "ldp-laplace", "clip_mean": 800.0, "frac_clipped_mean": 0.95}
    agg = pd.DataFrame([
        {**base, "eps_target": 8.0, "noise_scale_mean": 200.0, "mean_pre_clip_norm_mean": 1.4e7,
         "pre_clip_norm_growth_mean": 1.5e4},
        {**base, "eps_target": float("inf"), "noise_scale_mean": 0.0,
         "mean_pre_clip_norm_mean": 3220.0, "pre_clip_norm_growth_mean": 3.7}])
    (diverged,) = diverged_notes(agg)
    assert "ε 8: pre-clip norm grew 1.5e+04-fold" in diverged
    (mis_set,) = clipping_notes(agg)
    assert "ε ∞ (clip only): 95% of uploads clipped" in mis_set


def test_a_stop_landing_as_a_worker_takes_a_point_cancels_it(tmp_path, monkeypatch):
    """The pool's SIGTERM can reach a worker between its stop-flag check and the run: the
    worker is already marked busy there, so the signal interrupts it and the point comes
    back cancelled (before, the signal was ignored and the point ran to its end)."""
    from fedem_private.experiments import sweep
    from fedem_private.experiments.sweep_spec import grid, load_spec

    (point,) = grid(load_spec(None))[:1]
    seen = []

    class SignalledWhileChecking:
        def set(self) -> None:  # the handler records the stop
            pass

        def is_set(self) -> bool:
            seen.append(sweep._BUSY)
            sweep._on_sigint(15, None)  # the handler, as the signal would run it here
            return False

    monkeypatch.setattr(sweep, "_STOP", SignalledWhileChecking())
    monkeypatch.setattr(sweep, "execute_point", lambda *a: pytest.fail("the point ran"))
    outcome = sweep._work(point, tmp_path, False)
    assert seen == [True] and outcome.status == "cancelled" and not sweep._BUSY

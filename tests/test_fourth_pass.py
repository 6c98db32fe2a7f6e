"""A newcomer's fourth pass (issue 80): a result beside its references, a report that opens
with its verdict, plots and ladder tables that name things as people do, a race's loser that
says where its results went, and a plan's time that counts the catalogue."""

from __future__ import annotations

import pytest

from fedem_private.cli import main

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def _synthetic(tmp_path, users=40, items=60):
    """A run config of a small synthetic population (its path, for --config)."""
    path = tmp_path / "synthetic.toml"
    path.write_text(f"[data.synthetic]\nn_users = {users}\nn_items = {items}\n"
                    "mean_activity = 8\n")
    return str(path)


# ------------------------------------------------------- 6: the losing run of a race
@pytest.mark.parametrize("method", ["fedmf", "mostpop"])
def test_the_losing_run_of_a_race_exits_0_and_says_where_its_results_went(
        tmp_path, capsys, monkeypatch, method):
    """Two runs started together into one --out: the one that finishes second keeps its
    results beside the folder (``-2``), reads them there and exits 0 with one line saying
    so; it exited 2 with an error line although nothing was lost."""
    from fedem_private.experiments import rundir

    out = tmp_path / "run"
    real = rundir.RunDir.commit_or_moved

    def other_finishes_first(self):  # the other run commits just before this one
        out.mkdir(exist_ok=True)  # it may hold this run's progress files
        (out / "summary.json").write_text("{}")
        return real(self)

    monkeypatch.setattr(rundir.RunDir, "commit_or_moved", other_finishes_first)
    code = main(["run", "--config", _synthetic(tmp_path), "--method", method, "--out", str(out),
                 *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    kept = tmp_path / "run-2"
    assert f"wrote {kept}" in captured.out
    assert (kept / "summary.json").is_file() and (kept / "config.toml").is_file()
    assert (out / "summary.json").read_text() == "{}"  # the other run's, untouched
    notes = [line for line in captured.err.splitlines() if "another run" in line]
    assert len(notes) == 1 and f"this run's results are in {kept}" in notes[0]
    assert "error" not in captured.err


# ------------------------------------------------ 4: the progress bar's two epsilons
class _Bar:
    """A stand-in for tqdm that records what the progress hooks give it."""

    lines: list[str] = []
    postfixes: list[dict] = []

    def __init__(self, **kwargs):
        pass

    def set_postfix(self, post, refresh=True):
        _Bar.postfixes.append(dict(post))

    def update(self, n):
        pass

    def close(self):
        pass

    @classmethod
    def write(cls, text, file=None):
        cls.lines.append(text)


def test_the_central_bar_names_the_aggregators_eps_and_says_once_what_it_is(monkeypatch):
    """cdp-gaussian's bar showed ``eps_aggregator`` climbing past --epsilon with no word of
    what it is: it is named as the epsilon against the aggregator, unamplified, and one line
    above the bar, written when it first shows, says what each figure is."""
    from types import SimpleNamespace

    import tqdm

    from fedem_private import api

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    _Bar.lines, _Bar.postfixes = [], []
    cfg = api.resolve_config(None, {"privacy.mode": "cdp-gaussian", "privacy.epsilon": 4.0,
                                    "privacy.clip": 1.0, "train.rounds": 3})
    on_start, on_round, close = api._progress_hooks(cfg)
    on_start(SimpleNamespace(state=SimpleNamespace(round=0)))
    for r, (observer, aggregator) in enumerate([(1.0, 3.0), (2.0, 8.0), (4.0, 12.0)], 1):
        on_round(SimpleNamespace(round=r, metrics=None, privacy={
            "eps_spent_observer": observer, "eps_spent": aggregator}))
    close()
    assert [p["eps vs aggregator (unamplified)"] for p in _Bar.postfixes] == ["3", "8", "12"]
    assert [p["eps (observers)"] for p in _Bar.postfixes] == ["1", "2", "4"]
    assert not any("eps_aggregator" in key for p in _Bar.postfixes for key in p)
    assert len(_Bar.lines) == 1  # said once, where the figures first appear
    assert "eps vs aggregator (unamplified)" in _Bar.lines[0]
    assert "climbs past --epsilon" in _Bar.lines[0] and "released models" in _Bar.lines[0]

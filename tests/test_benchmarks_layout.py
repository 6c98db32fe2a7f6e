"""benchmarks/ as a checked layer (issue 41, item 5; benchmarks/README.md): sweep files and
drivers under specs/<topic>/, results under results/<topic>/ named by what they measure,
and every sweep file still loads."""
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
TOPICS = {"utility", "privacy", "attacks", "reproduction", "speed", "population"}
SPECS = sorted((BENCH / "specs").rglob("*.toml"))


def test_specs_and_results_sit_in_topic_folders():
    assert {p.name for p in (BENCH / "specs").iterdir()} == TOPICS
    # the ladder keeps its own folder beside the topics (benchmarks/ladder.py writes it)
    assert {p.name for p in (BENCH / "results").iterdir()} == TOPICS | {"ladder"}
    loose = [p.name for p in BENCH.iterdir() if p.suffix in (".toml", ".sh")]
    assert loose == [], f"sweep files and drivers belong under benchmarks/specs/<topic>/: {loose}"


def test_results_are_named_by_what_they_measure():
    named = [p.relative_to(BENCH).as_posix() for p in (BENCH / "results").rglob("*")
             if "issue" in p.name.lower()]
    assert named == []


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(BENCH).as_posix())
def test_every_spec_loads(path):
    from fedem_private.experiments.sweep_spec import load_spec
    from fedem_private.simulation.config import load_toml

    text = tomllib.loads(path.read_text())
    base = text.get("base", text)
    if base.get("train", {}).get("device") == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU: the spec asks for device cuda")
    if "sweep" in text:
        load_spec(path)
    else:  # a run config (fedem-private run --config FILE)
        load_toml(path)


TUNES = sorted((BENCH / "tune").glob("*.toml"))


@pytest.mark.parametrize("path", TUNES, ids=lambda p: p.name)
def test_every_tuning_file_loads(path, request, monkeypatch, tmp_path):
    """Each committed study file parses, its base validates and every searched key is a
    config key (load_tune_spec also checks [tune] objective and [tune.private], and a trial
    at each range's low end): a typo would otherwise surface only when someone starts an
    hours-long study. A population calibrated to a real dataset is validated against that
    dataset's files, so such a file is skipped where the dataset is absent (a fresh clone
    has no ../shared)."""
    from conftest import dataset_dir

    from fedem_private.experiments.tune import load_tune_spec

    data = tomllib.loads(path.read_text()).get("base", {}).get("data", {})
    if data.get("calibrate_to"):
        monkeypatch.chdir(ROOT)  # the file's data_dir is relative to the checkout
        found = dataset_dir(data["calibrate_to"], request.node.nodeid)  # skips when absent
        if "data_dir" in data and not Path(data["data_dir"]).exists():  # only in the cache
            copy = tmp_path / path.name
            copy.write_text(path.read_text().replace(f'"{data["data_dir"]}"', f'"{found}"'))
            path = copy
    base, space, trials, _ = load_tune_spec(path)
    assert space and trials >= 1 and "federation" in base


def test_every_relative_import_in_benchmarks_resolves() -> None:
    """Imports made inside functions (a subprocess child's, say) name modules that exist:
    moving a benchmark into ``probes/`` once left ``from .peer import`` pointing nowhere,
    which only the published code's run would have found."""
    import ast
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    missing = []
    for path in sorted((root / "benchmarks").rglob("*.py")):
        package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
                if importlib.util.find_spec(name) is None:
                    missing.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    assert not missing, missing

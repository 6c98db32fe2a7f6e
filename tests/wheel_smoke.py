"""The built wheel, installed outside the source tree, runs README's main job (tox -e wheel).

Builds the sdist and, from it, the wheel (``python -m build``), checks both with
``twine check --strict``, installs the wheel (not editable, with its dependencies) into the
running environment, then, in an empty temporary directory where the checkout cannot be
imported by accident, checks that ``fedem_private`` and ``attacks`` are the installed copies
and runs README's "Set up" command after its install step (today ``fedem-private sweep
--jobs 2 && fedem-private report runs/quick-sweep``). A module or data file missing from the
package fails here. ``--no-job`` stops after the import check (a quick look at a wheel).

Run it in a throw-away environment: it installs into the one running it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install -e . && "
# benchmarks/ stays out (pyproject.toml): opacus installs a top-level `benchmarks` of its own
WHEEL_TOPS = {"fedem_private", "attacks"}

# run in the empty directory by the installed interpreter: where the packages come from
IMPORT_CHECK = """\
import sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"]).resolve()
import attacks, fedem_private
for mod in (fedem_private, attacks):
    where = Path(mod.__file__).resolve()
    assert site in where.parents, f"{mod.__name__} imported from {where}, not from {site}"
typed = Path(fedem_private.__file__).with_name("py.typed")
assert typed.is_file(), f"no {typed}"
print(f"fedem_private {fedem_private.__version__} from {Path(fedem_private.__file__).parent}")
"""


def wheel_tops(wheel: Path) -> set[str]:
    """The top-level names a wheel installs (its .dist-info aside)."""
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[0] for n in z.namelist() if ".dist-info/" not in n}


def carries_license(archive: Path) -> bool:
    """Whether a wheel (under .dist-info/licenses/) or an sdist (at its root) holds LICENSE."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    with tarfile.open(archive) as t:
        return any(n.count("/") == 1 and n.endswith("/LICENSE") for n in t.getnames())


def main_job(readme: str) -> str:
    """README's main job: the "Set up" block's command after its ``pip install -e .``."""
    _, found, section = readme.partition("## Set up")
    block = re.search(r"```sh\n(.*?)```", section, re.S) if found else None
    if block is None:
        raise SystemExit("README.md: no ```sh block under '## Set up'")
    line = " ".join(block.group(1).replace("\\\n", " ").split())
    _, found, job = line.partition(INSTALL)
    if not found or not job.strip():
        raise SystemExit(f"README.md's Set up command has no {INSTALL!r}<job>: {line!r}")
    return job.strip()


def _run(cmd: list[str] | str, cwd: Path, **kw) -> float:
    """Run ``cmd`` (a list, or a shell line), fail on a non-zero exit; its seconds."""
    start = time.perf_counter()
    print(f"$ {cmd if isinstance(cmd, str) else ' '.join(map(str, cmd))}", flush=True)
    code = subprocess.call(cmd, cwd=cwd, shell=isinstance(cmd, str), **kw)
    if code:
        raise SystemExit(f"exit {code}: {cmd}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-job", action="store_true", help="stop after the import check")
    args = parser.parse_args(argv)
    job = main_job((ROOT / "README.md").read_text(encoding="utf-8"))
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fedem-wheel-") as tmp:
        dist, work = Path(tmp) / "dist", Path(tmp) / "work"
        work.mkdir()
        times["build"] = _run([sys.executable, "-m", "build", "--outdir", str(dist),
                               str(ROOT)], cwd=work)
        built = sorted(dist.iterdir())
        wheels = [p for p in built if p.suffix == ".whl"]
        if len(wheels) != 1 or len(built) != 2:
            raise SystemExit(f"expected one wheel and one sdist, got {built}")
        tops = wheel_tops(wheels[0])
        if tops != WHEEL_TOPS:
            raise SystemExit(f"the wheel's top-level names are {sorted(tops)}, expected "
                             f"{sorted(WHEEL_TOPS)}")
        bare = [p.name for p in built if not carries_license(p)]
        if bare:
            raise SystemExit(f"no LICENSE in {bare} (pyproject.toml: license-files)")
        times["twine"] = _run([sys.executable, "-m", "twine", "check", "--strict",
                               *map(str, built)], cwd=work)
        # with its dependencies, then this wheel again over a copy an earlier run installed
        pip = [sys.executable, "-m", "pip", "install"]
        times["install"] = (_run([*pip, str(wheels[0])], cwd=work)
                            + _run([*pip, "--force-reinstall", "--no-deps", str(wheels[0])],
                                   cwd=work))
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # nothing but the installed copy
        scripts = sysconfig.get_paths()["scripts"]
        env["PATH"] = scripts + os.pathsep + env.get("PATH", "")
        times["import"] = _run([sys.executable, "-c", IMPORT_CHECK], cwd=work, env=env)
        if not args.no_job:
            times["job"] = _run(job, cwd=work, env=env)
            if not list(work.glob("runs/**/report.md")):
                raise SystemExit("the main job wrote no runs/**/report.md")
    print("wheel ok; seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

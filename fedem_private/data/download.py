"""Fetch official dataset archives once into a cache, with SHA-256 checks.

Nothing is downloaded at import time or implicitly: only
``fedem-private datasets download NAME`` (or :func:`download`) goes online.
Where this project pins a checksum (of the archive or of a file inside it) a
mismatch is an error and nothing is kept. Where none is pinned, the observed
SHA-256 is recorded in the cache manifest and reported as unverified; pass
``sha256=`` to verify the archive against a value you trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError


@dataclass(frozen=True)
class Source:
    """Where a dataset's official archive lives and what its files must hash to."""

    url: str
    files: dict[str, str | None] = field(default_factory=dict)
    archive_sha256: str | None = None


REGISTRY: dict[str, Source] = {
    "ml-100k": Source(
        "https://files.grouplens.org/datasets/movielens/ml-100k.zip",
        {"u.data": "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490",
         "u.user": "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c"}),
    "ml-1m": Source("https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                    {"ratings.dat": None, "users.dat": None}),
    "filmtrust": Source(
        "https://guoguibing.github.io/librec/datasets/filmtrust.zip",
        {"ratings.txt": "15bc987f1176d3d2145930dbd33ae312149d884f18f2f3aa66dda61cbfea2d56"}),
    "lastfm-2k": Source(
        "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
        {"user_artists.dat": None}),
}


def default_cache_dir() -> Path:
    """``$FEDEM_PRIVATE_CACHE`` or ``~/.cache/fedem-private``."""
    env = os.environ.get("FEDEM_PRIVATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fedem-private"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_dir(name: str, cache_dir: Path | None = None) -> Path | None:
    """The cached copy of a dataset, if a complete one exists."""
    target = (cache_dir or default_cache_dir()) / name
    return target if (target / "manifest.json").is_file() else None


def download(name: str, cache_dir: Path | None = None, url: str | None = None,
             sha256: str | None = None, timeout: float = 60.0) -> tuple[Path, dict]:
    """Download and unpack ``name`` into ``cache_dir/name``; return (folder, manifest).

    The folder appears only once every check passed (unpacked in a temporary
    sibling, then renamed), so an interrupted download leaves no half copy.
    """
    if name not in REGISTRY:
        raise UserError(f"unknown dataset {name!r} for download; choose one of "
                        f"{', '.join(sorted(REGISTRY))}")
    source = REGISTRY[name]
    cache = cache_dir or default_cache_dir()
    target = cache / name
    if (target / "manifest.json").is_file():
        return target, json.loads((target / "manifest.json").read_text())
    made = [d for d in (cache, *cache.parents) if not d.exists()]  # removed again on failure
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the dataset cache {cache}: {exc.strerror}") from None
    try:
        return _fetch(name, source, cache, url or source.url, sha256 or source.archive_sha256,
                      timeout)
    except BaseException:
        for folder in made:  # the cache folders this call made, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _fetch(name: str, source: Source, cache: Path, address: str, expected_archive: str | None,
           timeout: float) -> tuple[Path, dict]:
    """Download, check and unpack into ``cache/name`` (see :func:`download`)."""
    target = cache / name
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{name}-") as tmp:
        tmp_path = Path(tmp)
        archive = tmp_path / "archive.zip"
        try:
            with urllib.request.urlopen(address, timeout=timeout) as resp:
                with archive.open("wb") as out:
                    shutil.copyfileobj(resp, out)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(f"dataset {name}: download from {address} failed: {exc}; without "
                            f"a network here, fetch {source.url} elsewhere and pass --url "
                            f"file:///path/to/{source.url.rsplit('/', 1)[-1]}, or run with "
                            f"--data-dir pointing at an unpacked copy") from exc
        digest = sha256_of(archive)
        if expected_archive and digest != expected_archive.lower():
            raise UserError(f"dataset {name}: archive SHA-256 mismatch: expected "
                            f"{expected_archive}, got {digest}")
        unpacked = tmp_path / name
        unpacked.mkdir()
        try:
            with zipfile.ZipFile(archive) as zf:
                members = {Path(i.filename).name: i for i in zf.infolist() if not i.is_dir()}
                missing = [f for f in source.files if f not in members]
                if missing:
                    raise UserError(f"dataset {name}: archive lacks {', '.join(missing)}")
                for fname, info in members.items():
                    if fname.startswith(".") or "/." in info.filename:
                        continue
                    with zf.open(info) as src, (unpacked / fname).open("wb") as dst:
                        shutil.copyfileobj(src, dst)
        except zipfile.BadZipFile as exc:
            raise UserError(f"dataset {name}: downloaded file is not a zip archive") from exc
        files = {}
        for fname, pinned in source.files.items():
            got = sha256_of(unpacked / fname)
            if pinned and got != pinned:
                raise UserError(f"dataset {name}: {fname} SHA-256 mismatch: expected {pinned}, "
                                f"got {got}")
            files[fname] = {"sha256": got, "verified": bool(pinned)}
        manifest = {"name": name, "url": address, "archive_sha256": digest,
                    "archive_verified": bool(expected_archive), "files": files}
        (unpacked / "manifest.json").write_text(json.dumps(manifest, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return target, manifest

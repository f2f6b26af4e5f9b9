"""save_fit writes all or nothing: a save that fails part-way (a full disk, a file-size limit)
leaves the previous fit at the path intact, leaves no temporary file behind and raises an
``OSError`` that names the path and what to do (issue 39, item 2)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.serialization import load_fit, save_fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fit(hidden):
    model = pb.BNN(pb.MLP(1, [hidden], 1))
    guide = pb.MeanField(model)
    x, y = torch.randn(10, 1), torch.randn(10)
    guide(x, y)  # the guide's parameters exist: a fit that can be saved
    return model, guide, x, y


def test_a_save_over_a_file_replaces_it_with_the_umask_mode(tmp_path):
    path = tmp_path / "fit.pt"
    save_fit(path, *_fit(3))
    save_fit(path, *_fit(5))
    model, _ = load_fit(path)
    assert model.net.hidden_sizes == (5,)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as torch.save(path) gives, not mkstemp's 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.pt"]


def test_a_write_failing_part_way_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "fit.pt"
    save_fit(path, *_fit(3))
    before = path.read_bytes()
    real = torch.save

    def fails_part_way(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 the first bytes of a zip archive")
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", fails_part_way)
    with pytest.raises(
        OSError,
        match=r"save_fit could not write .*fit\.pt.*stopped part-way.*Nothing was changed"
        r".*call save_fit again",
    ) as info:
        save_fit(path, *_fit(5))
    assert "enforce fail" not in str(info.value)  # torch's message is the cause, not the error
    monkeypatch.setattr(torch, "save", real)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.pt"]  # no temporary file left
    assert load_fit(path)[0].net.hidden_sizes == (3,)


def test_a_file_size_limit_in_a_subprocess_keeps_the_previous_file(tmp_path):
    """A real failed write: ``RLIMIT_FSIZE`` below the new file's size (``SIGXFSZ`` ignored, so the
    write fails with ``EFBIG`` as on a full disk instead of killing the process)."""
    pytest.importorskip("resource")  # the limit is set in the child (POSIX only)
    good, big = tmp_path / "fit.pt", tmp_path / "big.pt"
    save_fit(good, *_fit(3))
    save_fit(big, *_fit(400))
    before = good.read_bytes()
    limit = big.stat().st_size // 2
    assert limit > len(before)
    script = textwrap.dedent(f"""
        import resource, signal
        from pyro_bnnlv.serialization import load_fit, save_fit
        import torch
        model, guide = load_fit({str(big)!r})
        x, y = torch.zeros(10, 1), torch.zeros(10)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        try:
            save_fit({str(good)!r}, model, guide, x, y)
        except OSError as err:
            print(type(err).__name__, err)
        else:
            print("saved")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OSError [Errno 27] save_fit could not write"), out.stdout
    assert "File too large" in out.stdout and "ulimit -f" in out.stdout
    assert good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pt", "fit.pt"]

"""load_fit never runs code from a file, refuses classes outside its allow-list, and says what a
file is when it is not a fit; save_fit refuses, before writing, what could not be read back."""

import os
import pickle

import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv import serialization
from pyro_bnnlv.serialization import load_fit, register_class, save_fit


class _Payload:
    """Unpickling this runs ``os.system("touch MARKER")``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def fit_file(tmp_path):
    model = pb.BNN(pb.MLP(1, [4], 1))
    x, y = torch.randn(10, 1), torch.randn(10)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, x, y, num_steps=3, seed=0, progress=False)
    path = tmp_path / "fit.pt"
    save_fit(path, model, guide, x, y)
    return path


def test_the_payload_would_run_under_a_plain_unpickler(tmp_path):
    """The control: the payload is real (pickle.loads creates the marker)."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("where", ["top", "model_config", "guide_state"])
def test_reduce_payload_is_refused_without_running(where, fit_file, tmp_path):
    marker = tmp_path / "pwned"
    payload = torch.load(fit_file, weights_only=True)
    if where == "top":
        payload = _Payload(marker)
    elif where == "model_config":
        payload["model_config"]["net"] = _Payload(marker)
    else:
        payload["guide_state"]["locs.w"] = _Payload(marker)
    path = tmp_path / "crafted.pt"
    torch.save(payload, path)
    with pytest.raises(ValueError, match=r"not a pyro_bnnlv fit: it refers to the Python object \S*system"):
        load_fit(path)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["model_class", "guide_class"])
@pytest.mark.parametrize("name", ["os:system", "builtins:eval", "subprocess:Popen"])
def test_class_names_outside_the_allow_list_are_refused(key, name, fit_file, tmp_path):
    marker = tmp_path / "pwned"
    payload = torch.load(fit_file, weights_only=True)
    payload[key] = name
    payload["model_config"] = f"touch {marker}"  # what os.system would receive
    payload["guide_kwargs"] = {"args": f"touch {marker}"}
    path = tmp_path / "crafted.pt"
    torch.save(payload, path)
    what = key.removesuffix("_class")
    with pytest.raises(ValueError, match=rf"names the {what} class '{name}', which is not one load_fit rebuilds"):
        load_fit(path)
    assert not marker.exists()


def test_load_fit_reads_with_weights_only(fit_file, monkeypatch):
    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    load_fit(fit_file)
    assert calls == [True]


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", r"is empty \(0 bytes\)"),
        (b"hello, not a torch file\n", "torch.load cannot read it"),
        ("state_dict", r"a state dict of 2 tensors \(keys 'weight', 'bias'\).*load_state_dict"),
        ("tensor", r"a single tensor of shape \(3, 2\)"),
        ("list", "holds a list"),
        ("dict", r"a dict with keys 'epoch', 'losses'"),
        ("truncated", "torch.load cannot read it"),
        ("future", "unsupported fit file format 99"),
    ],
)
def test_files_that_are_not_fits_say_what_they_are(content, match, fit_file, tmp_path):
    path = tmp_path / "other.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "truncated":
        path.write_bytes(fit_file.read_bytes()[:200])
    else:
        obj = {
            "state_dict": torch.nn.Linear(2, 3).state_dict(),
            "tensor": torch.zeros(3, 2),
            "list": [1, 2],
            "dict": {"epoch": 3, "losses": [1.0]},
            "future": {**torch.load(fit_file, weights_only=True), "format": 99},
        }[content]
        torch.save(obj, path)
    with pytest.raises(ValueError, match=match):
        load_fit(path)


def test_save_fit_refuses_what_could_not_be_read_back(tmp_path):
    model = pb.BNN(pb.MLP(1, [4], 1))
    x, y = torch.randn(10, 1), torch.randn(10)
    guide = AutoNormal(model)
    with pytest.raises(TypeError, match=r"guide_kwargs\['init_loc_fn'\] is a function.*drop it"):
        save_fit(tmp_path / "a.pt", model, guide, x, y, guide_kwargs={"init_loc_fn": pb.init_to_network(model)})
    with pytest.raises(TypeError, match=r"model_kwargs\['f'\] is a object;"):
        save_fit(tmp_path / "b.pt", model, guide, x, y, model_kwargs={"f": object()})
    hyper = pb.HypernetGuide(model, activation=lambda: torch.nn.ReLU())
    with pytest.raises(ValueError, match="not a torch.nn class"):
        save_fit(tmp_path / "c.pt", model, hyper, x, y)

    class MyGuide(AutoNormal):
        pass

    with pytest.raises(TypeError, match="register_class"):
        save_fit(tmp_path / "d.pt", model, MyGuide(model), x, y)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_register_class_admits_a_users_own_guide(tmp_path, monkeypatch):
    monkeypatch.setattr(serialization, "_GUIDES", dict(serialization._GUIDES))  # undone after the test

    class MyGuide(AutoNormal):
        pass

    model = pb.BNN(pb.MLP(1, [4], 1))
    x, y = torch.randn(10, 1), torch.randn(10)
    guide = MyGuide(model)
    pb.fit_svi(model, guide, x, y, num_steps=3, seed=0, progress=False)
    register_class(MyGuide, "guide")
    save_fit(tmp_path / "mine.pt", model, guide, x, y)
    _, guide2 = load_fit(tmp_path / "mine.pt")
    assert type(guide2) is MyGuide
    assert torch.load(tmp_path / "mine.pt", weights_only=True)["guide_class"] == "MyGuide"
    with pytest.raises(ValueError, match="kind must be"):
        register_class(MyGuide, "loss")


def test_register_class_refuses_a_name_taken_by_another_class(tmp_path, monkeypatch):
    """Files name classes by registered name: two classes may not share one."""
    monkeypatch.setattr(serialization, "_GUIDES", dict(serialization._GUIDES))

    class MeanField(AutoNormal):  # a user's class named like the library's
        pass

    with pytest.raises(
        ValueError,
        match=r"the guide name 'MeanField' is already registered for "
        r"pyro_bnnlv.guides.mean_field.MeanField; .*name='MyMeanField'",
    ):
        register_class(MeanField, "guide")
    with pytest.raises(ValueError, match=r"name must be a Python identifier"):
        register_class(MeanField, "guide", name="my:guide")
    register_class(MeanField, "guide", name="UsersMeanField")
    register_class(MeanField, "guide", name="UsersMeanField")  # the same class again: fine
    model = pb.BNN(pb.MLP(1, [4], 1))
    x, y = torch.randn(10, 1), torch.randn(10)
    guide = MeanField(model)
    guide(x, y)
    save_fit(tmp_path / "mine.pt", model, guide, x, y)
    assert torch.load(tmp_path / "mine.pt", weights_only=True)["guide_class"] == "UsersMeanField"
    assert type(load_fit(tmp_path / "mine.pt")[1]) is MeanField


def test_load_fit_leaves_the_random_stream_alone(fit_file):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    load_fit(fit_file)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


def test_format_1_file_saved_without_y_loads(tmp_path):
    """Files written before the fix (format 1, ``y_shape`` None) load: y's shape comes from the model."""
    model = pb.BNN(pb.MLP(1, [4], 1))
    x, y = torch.randn(10, 1), torch.randn(10)
    guide = AutoNormal(model)
    pb.fit_svi(model, guide, x, y, num_steps=3, seed=0, progress=False)
    save_fit(tmp_path / "new.pt", model, guide, x, y)
    payload = torch.load(tmp_path / "new.pt", weights_only=True)
    payload.update(format=1, y_shape=None, guide_kwargs={})
    torch.save(payload, tmp_path / "old.pt")
    _, guide2 = load_fit(tmp_path / "old.pt")
    torch.testing.assert_close(guide2.locs.w, guide.locs.w, rtol=0, atol=0)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("x_dtype", "torch.load", "not a floating-point torch dtype"),
        ("model_class", ["a", "list"], "names the model class"),
    ],
)
def test_crafted_fields_are_checked(field, value, match, fit_file, tmp_path):
    payload = torch.load(fit_file, weights_only=True)
    payload[field] = value
    torch.save(payload, tmp_path / "crafted.pt")
    with pytest.raises(ValueError, match=match):
        load_fit(tmp_path / "crafted.pt")

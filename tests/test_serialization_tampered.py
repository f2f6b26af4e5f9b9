"""Tampered fit files (issue 39, item 7): load_fit checks every field it reads before building
anything, and names the field and that the file is damaged or was not written by save_fit,
instead of failing later with a torch message (or asking the allocator for terabytes)."""

import math

import pytest
import torch
from pyro.infer.autoguide import AutoLowRankMultivariateNormal

import pyro_bnnlv as pb
from pyro_bnnlv.serialization import load_fit, save_fit

DAMAGED = "is damaged or was not written by save_fit: "
AGAIN = "; write the fit again with save_fit"


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(10, 1, generator=g), torch.randn(10, generator=g)


def _guide(kind, model, x, y):
    if kind == "laplace":
        w = pb.train_map(model, x, y, num_steps=20, seed=0, progress=False)
        return pb.LinearizedLaplace(model, w, structure="full").fit(x, y).as_guide()
    guide = {
        "mean-field": pb.MeanField,
        "hypernet": pb.HypernetGuide,
        "low-rank": lambda m: AutoLowRankMultivariateNormal(m, rank=2),
    }[kind](model)
    guide(x, y)
    return guide


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """One saved fit per guide kind: ``{kind: payload}`` (a BNN 1 -> [4] -> 1, 10 points)."""
    out = {}
    for kind in ("mean-field", "hypernet", "low-rank", "laplace"):
        model = pb.BNN(pb.MLP(1, [4], 1), noise_scale=0.2)
        x, y = _data()
        path = tmp_path_factory.mktemp(kind) / "fit.pt"
        save_fit(path, model, _guide(kind, model, x, y), x, y)
        out[kind] = torch.load(path, weights_only=True)
    linear = pb.OverparametrisedLinear(3, noise_scale=0.5)
    guide = pb.MeanField(linear)
    guide(torch.ones(4), torch.zeros(4))
    path = tmp_path_factory.mktemp("linear") / "fit.pt"
    save_fit(path, linear, guide, torch.ones(4), torch.zeros(4))
    out["linear"] = torch.load(path, weights_only=True)
    return out


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(payload):
        target = payload
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value

    return edit


def _scaled(factor):
    return lambda t: t * factor


CASES = {
    # data shapes
    "x_shape negative": ("mean-field", _set("x_shape", (-5, 1)), r"x_shape \(-5, 1\) has a size below 1"),
    "x_shape huge": (
        "mean-field",
        _set("x_shape", (10**12, 1)),
        r"x_shape \(1000000000000, 1\) describes 1e\+12 values",
    ),
    "x_shape not a shape": ("mean-field", _set("x_shape", "10x1"), r"x_shape is '10x1', not the shape \(N, D\)"),
    "y_shape rows differ": (
        "mean-field",
        _set("y_shape", (11,)),
        r"y_shape \(11,\) has another number of rows than x_shape \(10, 1\)",
    ),
    "x_shape of another width": (
        "mean-field",
        _set("x_shape", (10, 3)),
        r"x_shape / y_shape \(10, 3\) / \(10,\) do not fit the BNN: x must have shape \(N, 1\)",
    ),
    "x_dtype integer": (
        "mean-field",
        _set("x_dtype", "torch.int64"),
        r"x_dtype 'torch.int64' is not a floating-point torch dtype",
    ),
    # the network
    "hidden size huge": (
        "mean-field",
        _set("model_config", "net", "hidden_sizes", [10**6, 10**6]),
        r"model_config\['net'\]\['hidden_sizes'\]\[0\] is 1000000, larger than the file's \d+ parameter values",
    ),
    "hidden size negative": (
        "mean-field",
        _set("model_config", "net", "hidden_sizes", [-3]),
        r"model_config\['net'\] does not describe a network: hidden_sizes\[0\] must be",
    ),
    "hidden size that does not match": (
        "mean-field",
        _set("model_config", "net", "hidden_sizes", [5]),
        r"is inconsistent .*describes a network of 16 weights but model_state\['prior_loc'\] has shape \(13,\)",
    ),
    # guide options
    "unknown guide option": (
        "mean-field",
        _set("guide_kwargs", {"bogus": 1}),
        r"guide_kwargs has the option\(s\) \['bogus'\], which MeanField does not take \(it takes \[",
    ),
    "unknown Laplace option": (
        "laplace",
        _set("guide_kwargs", {"site": "w", "loc": 0.0}),
        r"\['loc'\], which LaplaceGuide does not take \(it takes \['site'\]\)",
    ),
    "hypernet hidden sizes huge": (
        "hypernet",
        _set("guide_kwargs", "hidden_sizes", [10**5, 10**5]),
        r"guide_kwargs\['hidden_sizes'\]\[0\] is 100000, larger than",
    ),
    "hypernet layers too many weights": (
        "hypernet",
        _set("guide_kwargs", "hidden_sizes", [40, 40]),
        r"guide_kwargs\['hidden_sizes'\] \[40, 40\] describes layers of more weights",
    ),
    "hypernet noise_dim huge": (
        "hypernet",
        _set("guide_kwargs", "noise_dim", 10**7),
        r"guide_kwargs\['noise_dim'\] is 10000000, larger than",
    ),
    "hypernet init_scale negative": (
        "hypernet",
        _set("guide_kwargs", "init_scale", -0.1),
        r"guide_kwargs\['init_scale'\] is -0.1: a scale must be positive",
    ),
    "hypernet activation not torch.nn": (
        "hypernet",
        _set("guide_kwargs", "activation", "os.system"),
        r"guide_kwargs .* do not rebuild a HypernetGuide for this BNN: ValueError: .*not a torch.nn",
    ),
    "low-rank rank huge": (
        "low-rank",
        _set("guide_kwargs", "rank", 50),
        r"guide_kwargs\['rank'\] is 50: a \(13, 50\) covariance factor holds more values",
    ),
    # state values
    "NaN location": (
        "mean-field",
        _set("guide_state", "locs.w_unconstrained", _scaled(math.nan)),
        r"guide_state\['locs.w_unconstrained'\] contains NaN or infinite values",
    ),
    "infinite location": (
        "laplace",
        _set("guide_state", "loc", _scaled(math.inf)),
        r"guide_state\['loc'\] contains NaN or infinite values",
    ),
    "negative noise": (
        "mean-field",
        _set("model_state", "noise_scale", torch.tensor(-0.2)),
        r"model_state\['noise_scale'\] has a value <= 0 \(-0.2\): a scale must be positive",
    ),
    "zero prior scale": (
        "mean-field",
        _set("model_state", "prior_scale", _scaled(0.0)),
        r"model_state\['prior_scale'\] has a value <= 0",
    ),
    "Laplace scale_tril with a negative diagonal": (
        "laplace",
        _set("guide_state", "scale_tril", _scaled(-1.0)),
        r"guide_state\['scale_tril'\] is not a Cholesky factor",
    ),
    "Laplace loc of another length": (
        "laplace",
        _set("guide_state", "loc", torch.zeros(14)),
        r"guide_state\['loc'\] has shape \(14,\) but the network of model_config\['net'\] has 13 weights",
    ),
    "integer state": (
        "mean-field",
        _set("guide_state", "locs.w_unconstrained", lambda t: t.long()),
        r"guide_state\['locs.w_unconstrained'\] has dtype torch.int64; save_fit writes float32 or float64",
    ),
    "float16 state": (
        "mean-field",
        _set("guide_state", "locs.w_unconstrained", lambda t: t.half()),
        r"has dtype torch.float16; save_fit writes float32 or float64",
    ),
    "one float64 buffer in a float32 model": (
        "mean-field",
        _set("model_state", "prior_loc", lambda t: t.double()),
        r"is inconsistent .*model_state\['prior_loc'\] has dtype torch.float64 but the rebuilt BNN holds torch.float32",
    ),
    "a state entry that is not a tensor": (
        "mean-field",
        _set("guide_state", "locs.w_unconstrained", [0.0] * 13),
        r"guide_state\['locs.w_unconstrained'\] is a list, not a tensor",
    ),
    # configuration values
    "NaN in the config": (
        "linear",
        _set("model_config", "noise_scale", math.nan),
        r"model_config\['noise_scale'\] is nan, not a finite number",
    ),
    "negative scale in the config": (
        "linear",
        _set("model_config", "prior_scale", [1.0, -1.0, 1.0]),
        r"model_config\['prior_scale'\]\[1\] is -1.0: a scale must be positive",
    ),
    "model_kwargs not a dict": ("mean-field", _set("model_kwargs", [1]), r"'model_kwargs' is a list, not a dict"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_field_is_named(case, fits, tmp_path, monkeypatch):
    kind, edit, match = CASES[case]
    payload = {k: (dict(v) if isinstance(v, dict) else v) for k, v in fits[kind].items()}
    payload["model_config"] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in payload["model_config"].items()}
    edit(payload)
    path = tmp_path / "tampered.pt"
    torch.save(payload, path)
    built = []
    real = pb.BNN.__init__
    monkeypatch.setattr(pb.BNN, "__init__", lambda self, *a, **k: (built.append(1), real(self, *a, **k))[1])
    with pytest.raises(ValueError, match=match) as info:
        load_fit(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert (DAMAGED in message and message.endswith(AGAIN)) or "is inconsistent (damaged or edited)" in message, message
    if DAMAGED in message and "do not fit the BNN" not in message and "do not rebuild" not in message:
        assert not built, "refused only after building the model"


def test_the_untampered_fits_load(fits, tmp_path):
    for kind, payload in fits.items():
        torch.save(payload, tmp_path / f"{kind}.pt")
        load_fit(tmp_path / f"{kind}.pt")

"""Whether NCAI's initialisation already makes ``f(x, z)`` lopsided over the latent prior on the
family's heavy-tailed problems, and where the lopsidedness comes from (issue 37).

    python docs/bench/ncai_family_init_skew.py [--problems 4 9 14 19] [--restarts 0 1] [--steps 3000]
        [--num-samples 500] [--redraws 50] [--ablations]

Per problem and restart, for BNN+LV MFVI and NCAI_0 (``compare``'s default budget, the tasks of
the store ``docs/results/sweeps/ncai-family``): the excess kurtosis and skewness of ``f(x, z*)``
over the latent prior, averaged over weight samples and test points (``per_point_test_ll`` of
``docs/bench/ncai_family_heavy_tails.py``, imported from it), at step 0 (the guide ``_fit``
starts from: ``MeanField(model, seed=seed)`` for MFVI, ``ncai_guide(model, x, y,
num_steps=cfg.map_steps, lr=cfg.lr, seed=seed)`` for NCAI_0) and after training
(:func:`~pyro_bnnlv.reproduce.ncai_compare._fit_task`), with each fit's test LL.

Then the guide means' one-hidden-layer network ``f = b2 + sum_j v_j leaky(a_j(x) + u_j z)`` at
the test inputs, per hidden unit ``j``: ``a_j(x)`` the pre-activation at ``z = 0``, ``u_j`` the
latent-input weight, ``v_j`` the output weight. Averaged over test inputs: the share of units
active at ``z = 0``; the sign balance of the slope, ``sum v_j u_j / sum |v_j u_j|`` over active
units; the share of units whose kink ``z_j = -a_j / u_j`` lies inside the prior's central 95%;
and the curvature balance ``sum c_j / sum |c_j|`` with ``c_j = v_j |u_j| phi(z_j / sigma_z)``
(each kink bends ``f`` by ``0.99 v_j |u_j|``, convex where ``v_j > 0``, weighted by how often
the prior reaches it: +1 is all the bend in the prior's bulk convex, which skews ``f`` to the
right, -1 concave). The skewness of the mean network over 256 equally spaced prior quantiles
is printed next to the guide's. Mechanisms, at step 0 only: the latent-input weights negated
(``f(x, -z)`` over a symmetric prior has the same distribution, so the skew is unchanged if
the code is right: a check, not a test of a mechanism); the latent-input weights redrawn
``--redraws`` times from the same Xavier law with the MAP network kept (does the MAP network fix
the skew's sign, or the draw?); the latent means, which ``f(x, z*)`` over the prior does not
read at step 0.

With ``--ablations``: NCAI_0 at restart 0 trained again (``_fit``'s ``fit_svi`` call, replayed
here; checked to reproduce ``_fit_task``'s fit on the first problem) from (i) latent means
redrawn from the prior with another seed, (ii) the latent-input weights of the redraw whose
step-0 skew is nearest to minus the original's (if of the other sign): the skew and test LL after training.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

import numpy as np
import torch

from pyro_bnnlv.datasets import load_dataset
from pyro_bnnlv.datasets.ncai_family import FAMILY
from pyro_bnnlv.guides.mean_field import MeanField
from pyro_bnnlv.guides.ncai_init import ncai_guide
from pyro_bnnlv.infer.svi import fit_svi, isolated_param_store
from pyro_bnnlv.models.bnnlv import BNNLV
from pyro_bnnlv.nets import MLP
from pyro_bnnlv.posterior import sample_posterior
from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, _architecture, _fit_task, _TrainingLog, compare_tasks
from pyro_bnnlv.stats.predictive import evaluate

_spec = importlib.util.spec_from_file_location(
    "ncai_family_heavy_tails", Path(__file__).with_name("ncai_family_heavy_tails.py")
)
_heavy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_heavy)
per_point_test_ll = _heavy.per_point_test_ll
METHODS = _heavy.METHODS  # ("BNN+LV (MFVI)", "BNN+LV (NCAI_0)")
NEG_SLOPE = 0.01  # leaky_relu's


class Fit:
    """What ``per_point_test_ll`` reads of a fit: its model and guide."""

    def __init__(self, model, guide):
        self.model, self.guide = model, guide


def initial_guide(method: str, task, cfg: CompareConfig, data):
    """The model and the untrained guide ``_fit`` builds for ``task`` (the same arguments)."""
    hidden, z_var, _ = _architecture(data.name, cfg)
    model = BNNLV(
        MLP(data.input_dim + 1, hidden, 1, activation="leaky_relu"),
        latent_dim=1,
        latent_scale=math.sqrt(z_var),
        noise_scale=math.sqrt(task.params["noise_var"]),
    )
    if method == METHODS[0]:
        guide = MeanField(model, seed=task.seed)
        with isolated_param_store(model, guide), torch.no_grad():
            guide(data.x_train, data.y_train)  # create the parameters at their initial values
    else:
        guide = ncai_guide(model, data.x_train, data.y_train, num_steps=cfg.map_steps, lr=cfg.lr, seed=task.seed)
    return model, guide


def _parts(model, w: torch.Tensor):
    """First layer on ``x``, its latent-input column ``u``, biases, output weights ``v`` and bias."""
    (fan_in, fan_out, w1, b1), (_, _, w2, b2) = model.net.layers
    W = w[w1].view(fan_out, fan_in)
    D = model.input_dim
    return W[:, :D], W[:, D].clone(), w[b1], w[w2].view(-1), w[b2]


def unit_profile(model, w: torch.Tensor, x: torch.Tensor, u: torch.Tensor | None = None) -> dict[str, float]:
    """The guide means' network at the test inputs ``x`` (see the module docstring); ``u``
    replaces the latent-input weights."""
    Wx, u0, b1, v, b2 = _parts(model, w.detach().double())
    u = u0 if u is None else u.double()
    sz = float(model.latent_scale)
    a = x.double() @ Wx.T + b1  # (N, H)
    active = a > 0
    vu = v * u
    slope = (vu * active).sum(1) / (vu.abs() * active).sum(1).clamp_min(1e-300)
    kink = -a / u
    inside = (kink.abs() < 1.96 * sz).double().mean(1)
    c = v * u.abs() * torch.exp(-0.5 * (kink / sz) ** 2)
    bend = c.sum(1) / c.abs().sum(1).clamp_min(1e-300)
    q = (torch.arange(256, dtype=torch.float64) + 0.5) / 256
    z = torch.special.ndtri(q) * sz  # (256,) symmetric about 0
    h = a[:, None, :] + u * z[None, :, None]  # (N, 256, H)
    f = torch.where(h > 0, h, NEG_SLOPE * h) @ v + b2  # (N, 256)
    cen = f - f.mean(1, keepdim=True)
    skew = (cen.pow(3).mean(1) / cen.pow(2).mean(1).pow(1.5).clamp_min(1e-300)).mean()
    return {
        "active": float(active.double().mean()),
        "slope_balance": float(slope.mean()),
        "kinks_inside": float(inside.mean()),
        "bend_balance": float(bend.mean()),
        "mean_net_skew": float(skew),
    }


def shape(model, guide, data, cfg) -> tuple[float, float, float]:
    """Test LL, excess kurtosis and skewness of ``f`` over ``z*`` (``per_point_test_ll``)."""
    ll, _, (kurt, skew) = per_point_test_ll(Fit(model, guide), data, cfg)
    return float(ll.mean()), kurt, skew


def _fmt(p: dict[str, float]) -> str:
    return (
        f"active {p['active']:.2f}, slope balance {p['slope_balance']:+.2f}, kinks inside 95% "
        f"{p['kinks_inside']:.2f}, bend balance {p['bend_balance']:+.2f}, mean-net skew {p['mean_net_skew']:+.2f}"
    )


def replay_ncai0(task, cfg, data, *, z_seed: int | None = None, u: torch.Tensor | None = None):
    """NCAI_0 trained as ``_fit`` trains it, from its initial guide with the latent means redrawn
    (``z_seed``) or the latent-input weights replaced (``u``); returns model, guide, valid LL."""
    model, guide = initial_guide(METHODS[1], task, cfg, data)
    with torch.no_grad():
        if z_seed is not None:
            g = torch.Generator().manual_seed(z_seed)
            z = guide.locs.z
            guide.locs.z = torch.randn(z.shape, generator=g, dtype=z.dtype) * model.latent_scale.detach()
        if u is not None:
            w = guide.locs.w.clone()
            w[model.latent_weight_mask()] = u.to(w.dtype)
            guide.locs.w = w
    log = _TrainingLog(guide, data.x_train, data.y_train, cfg.log_every, None)
    fit_svi(model, guide, data.x_train, data.y_train, num_steps=cfg.steps, lr=cfg.lr, loss=None,
            batch_size=cfg.batch_size, seed=task.seed, progress=False, callback=log)  # fmt: skip
    s = sample_posterior(model, guide, data.x_train, data.y_train, num_samples=cfg.num_samples, seed=task.seed)
    valid = evaluate(model, s, data.x_valid, data.y_valid, y_mean=0.0, y_std=1.0, seed=task.seed,
                     intervals=False, latent_draws=cfg.latent_draws)  # fmt: skip
    return model, guide, float(valid["test_ll"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, nargs="+", default=[4, 9, 14, 19])
    p.add_argument("--restarts", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=None, help="SVI and MAP steps (default: compare's, as the store)")
    p.add_argument("--num-samples", type=int, default=None, help="weight samples (default: compare's, 500)")
    p.add_argument("--redraws", type=int, default=50, help="Xavier redraws of the latent-input weights at step 0")
    p.add_argument("--ablations", action="store_true", help="retrain NCAI_0 (restart 0) from changed inits")
    args = p.parse_args()
    torch.set_num_threads(1)
    options = {} if args.steps is None else {"steps": args.steps, "map_steps": args.steps}
    cfg = CompareConfig(**options, **({} if args.num_samples is None else {"num_samples": args.num_samples}))
    rows = []
    for problem in args.problems:
        data = load_dataset(FAMILY[problem].name)
        all_tasks = compare_tasks(data.name, cfg)
        for restart in args.restarts:
            tasks = {t.method: t for t in all_tasks if t.restart == restart}
            print(f"# problem {problem:02d} restart {restart}")
            row = {"problem": problem, "restart": restart}
            for method in METHODS:
                task, tag = tasks[method], "ncai0" if method == METHODS[1] else "mfvi"
                model, guide = initial_guide(method, task, cfg, data)
                w0 = guide.locs.w.detach().clone()
                ll0, k0, s0 = shape(model, guide, data, cfg)
                prof0 = unit_profile(model, w0, data.x_test)
                print(f"{method} step 0: test LL {ll0:.3f}, f over z*: excess kurtosis {k0:.2f}, skewness {s0:+.2f}")
                print(f"  guide means at step 0: {_fmt(prof0)}")
                if method == METHODS[1]:
                    mask = model.latent_weight_mask()
                    with torch.no_grad():
                        guide.locs.w = torch.where(mask, -w0, w0)
                    _, kn, sn = shape(model, guide, data, cfg)
                    with torch.no_grad():
                        guide.locs.w = w0.clone()
                    print(f"  latent-input weights negated: skewness {sn:+.2f} (excess kurtosis {kn:.2f})")
                    H = int(mask.sum())
                    fan_in, fan_out = model.net.layers[0][:2]
                    xavier = math.sqrt(2.0 / (fan_in + fan_out))
                    gen = torch.Generator().manual_seed(10_000 + 100 * problem + restart)
                    draws = [torch.randn(H, generator=gen) * xavier for _ in range(args.redraws)]
                    profs = [unit_profile(model, w0, data.x_test, u=u) for u in draws]
                    sk = np.array([q["mean_net_skew"] for q in profs])
                    bb = np.array([q["bend_balance"] for q in profs])
                    r = float(np.corrcoef(sk, bb)[0, 1]) if len(sk) > 2 else float("nan")
                    agree = float(np.mean(np.sign(sk) == np.sign(bb)))
                    print(
                        f"  {args.redraws} Xavier redraws of the latent-input weights (MAP network kept): mean-net "
                        f"skew mean {sk.mean():+.2f}, sd {sk.std(ddof=1):.2f}, share > 0 {np.mean(sk > 0):.2f}, "
                        f"share with the original's sign {np.mean(np.sign(sk) == np.sign(prof0['mean_net_skew'])):.2f}; "
                        f"corr(skew, bend balance) {r:+.2f}, same sign {agree:.2f}"
                    )
                    mirror = int(np.argmin(np.abs(sk + prof0["mean_net_skew"])))  # nearest to minus the original
                    opposite = draws[mirror] if np.sign(sk[mirror]) != np.sign(prof0["mean_net_skew"]) else None
                fit = _fit_task(task, cfg, data)
                ll1, k1, s1 = shape(fit.model, fit.guide, data, cfg)
                prof1 = unit_profile(fit.model, fit.guide.locs.w, data.x_test)
                print(
                    f"{method} trained: valid LL {fit.valid_ll:.3f}, test LL {ll1:.3f}, f over z*: excess kurtosis "
                    f"{k1:.2f}, skewness {s1:+.2f}"
                )
                print(f"  guide means after training: {_fmt(prof1)}")
                row.update({f"{tag}_skew0": s0, f"{tag}_skew1": s1, f"{tag}_kurt0": k0, f"{tag}_kurt1": k1})
                row.update({f"{tag}_ll": ll1, f"{tag}_valid": fit.valid_ll, f"{tag}_bend0": prof0["bend_balance"]})
                if method == METHODS[1] and args.ablations and restart == args.restarts[0]:
                    if problem == args.problems[0]:  # the replay is _fit's training
                        _, _, v = replay_ncai0(task, cfg, data)
                        print(f"  replay of _fit (no change): valid LL {v:.6f} vs _fit_task's {fit.valid_ll:.6f}")
                    m, g, v = replay_ncai0(task, cfg, data, z_seed=20_000 + problem)
                    lla, ka, sa = shape(m, g, data, cfg)
                    print(f"  (i) latent means redrawn: valid LL {v:.3f}, test LL {lla:.3f}, skewness {sa:+.2f}")
                    if opposite is not None:
                        m, g, v = replay_ncai0(task, cfg, data, u=opposite)
                        w0b = w0.clone()
                        w0b[m.latent_weight_mask()] = opposite.to(w0.dtype)
                        s0b = unit_profile(m, w0b, data.x_test)["mean_net_skew"]
                        llb, kb, sb = shape(m, g, data, cfg)
                        print(
                            f"  (ii) latent-input weights redrawn (mean-net skew at step 0 {s0b:+.2f}): valid LL "
                            f"{v:.3f}, test LL {llb:.3f}, skewness after training {sb:+.2f}"
                        )
            rows.append(row)
    print("\n# per fit: skewness of f over z* at step 0 -> after training; test LL; NCAI_0 minus MFVI")
    print("problem restart | MFVI skew0 skew1 | NCAI_0 skew0 skew1 | NCAI_0 bend0 | MFVI LL NCAI_0 LL | diff")
    for r in rows:
        print(
            f"{r['problem']:02d} {r['restart']} | {r['mfvi_skew0']:+.2f} {r['mfvi_skew1']:+.2f} | "
            f"{r['ncai0_skew0']:+.2f} {r['ncai0_skew1']:+.2f} | {r['ncai0_bend0']:+.2f} | "
            f"{r['mfvi_ll']:.3f} {r['ncai0_ll']:.3f} | {r['ncai0_ll'] - r['mfvi_ll']:+.3f}"
        )
    if len(rows) > 2:
        d = np.array([r["ncai0_ll"] - r["mfvi_ll"] for r in rows])
        s0 = np.array([r["ncai0_skew0"] for r in rows])
        s1 = np.array([r["ncai0_skew1"] for r in rows])
        print(
            f"NCAI_0 minus MFVI test LL: mean {d.mean():+.3f}, SE {d.std(ddof=1) / math.sqrt(len(d)):.3f} over {len(d)} fits"
        )
        for tag, name in (("mfvi", "MFVI"), ("ncai0", "NCAI_0")):
            a0 = np.abs([r[f"{tag}_skew0"] for r in rows])
            a1 = np.abs([r[f"{tag}_skew1"] for r in rows])
            ch = a1 - a0
            print(
                f"{name}: mean |skew| at step 0 {a0.mean():.2f}, after training {a1.mean():.2f}; change "
                f"{ch.mean():+.2f} (SE {ch.std(ddof=1) / math.sqrt(len(ch)):.2f}), larger in {int(np.sum(ch > 0))} of {len(ch)}"
            )
        a = {k: np.abs([r[k] for r in rows]) for k in ("mfvi_skew0", "mfvi_skew1", "ncai0_skew0", "ncai0_skew1")}
        for name, e in (
            ("|skew| at step 0", a["ncai0_skew0"] - a["mfvi_skew0"]),
            ("|skew| after training", a["ncai0_skew1"] - a["mfvi_skew1"]),
            (
                "change of |skew| in training",
                (a["ncai0_skew1"] - a["ncai0_skew0"]) - (a["mfvi_skew1"] - a["mfvi_skew0"]),
            ),
        ):
            se = e.std(ddof=1) / math.sqrt(len(e))
            print(
                f"NCAI_0 minus MFVI, {name}: {e.mean():+.2f} (SE {se:.2f}), NCAI_0's larger in {int(np.sum(e > 0))} of {len(e)}"
            )
        for name, s in (("|skew at step 0|", np.abs(s0)), ("|skew after training|", np.abs(s1))):
            rho, pval = _spearman(s, d), _permutation_p(s, d)
            print(
                f"Spearman({name}, NCAI_0 minus MFVI) over {len(d)} fits: {rho:+.2f}, two-sided permutation p {pval:.3f}"
            )
        print(
            f"sign of NCAI_0's skew kept from step 0 to after training in {int(np.sum(np.sign(s0) == np.sign(s1)))} of {len(d)} fits"
        )


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _permutation_p(a: np.ndarray, b: np.ndarray, draws: int = 20_000) -> float:
    """Two-sided p of Spearman's rho against ``draws`` random permutations of ``b`` (seeded)."""
    rho, rng = abs(_spearman(a, b)), np.random.default_rng(0)
    hits = sum(abs(_spearman(a, rng.permutation(b))) >= rho - 1e-12 for _ in range(draws))
    return (hits + 1) / (draws + 1)


if __name__ == "__main__":
    main()

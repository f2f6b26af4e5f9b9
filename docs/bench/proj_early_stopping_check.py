"""How noisy is proj-uci's early-stopping check? BbB on a UCI set (random split 0, as
``reproduce proj-uci`` fits it: 1x50 ReLU, sigma_y = 0.1, N(0, 0.1) priors, 20 particles,
closed-form KL, minibatches of 128), run for ``--steps`` steps without stopping. Every 100 steps
the validation log-likelihood (eq. 7) of the guide by

* ``fresh20``: 20 fresh guide draws (the check before issue 17's paper run),
* ``crn100``: the same 100 draws at every check (``_CheckDraws``, the check now),
* ``ref2000``: 2,000 fresh draws (a reference),

and the test log-likelihood of 500 draws. Early stopping (patience 30 checks) is then applied to
each of the three after the fact.

    python docs/bench/proj_early_stopping_check.py boston 0.001 [--steps 12000] [--out traj.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pyro
import torch
from pyro.infer.autoguide import AutoNormal

from pyro_bnnlv.guides import init_to_network
from pyro_bnnlv.infer import fit_svi
from pyro_bnnlv.infer.elbos.closed_form_kl import ClosedFormKLElbo
from pyro_bnnlv.models import BNN
from pyro_bnnlv.models.projected import PAPER_SCALE
from pyro_bnnlv.nets import MLP
from pyro_bnnlv.reproduce.projected import _CheckDraws, _split
from pyro_bnnlv.stats.predictive import evaluate

RULES = ("fresh20", "crn100", "ref2000")


def stop_at(values: list[float], patience: int = 30) -> tuple[int, int]:
    """(index of the best check, index of the check that stops) under early stopping."""
    best, bad, best_i = -np.inf, 0, 0
    for i, v in enumerate(values):
        if v > best:
            best, bad, best_i = v, 0, i
        else:
            bad += 1
            if bad >= patience:
                return best_i, i
    return best_i, len(values) - 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset")
    p.add_argument("lr", type=float)
    p.add_argument("--steps", type=int, default=12_000)
    p.add_argument("--out", help="JSON file for the trajectory")
    args = p.parse_args()
    torch.set_num_threads(1)
    data = _split(args.dataset, "random", 0)
    net = MLP(data.input_dim, [50], 1, activation="relu")
    bnn = BNN(net, prior_scale=PAPER_SCALE, noise_scale=0.1)
    gen_fresh, gen_ref = torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)
    crn = _CheckDraws(("w",), 100, 0)
    rows: list[dict[str, float]] = []

    def ll(w, x, y) -> float:
        return float(evaluate(bnn, {"w": w}, x, y, y_mean=0.0, y_std=1.0, intervals=False)["test_ll"])

    def fresh(g, n, gen):
        return g.locs.w + g.scales.w * torch.randn(n, net.num_weights, generator=gen)

    def check(step: int, g: AutoNormal) -> None:
        if (step + 1) % 100:
            return
        with torch.no_grad():
            xv, yv = data.x_valid, data.y_valid
            rows.append(
                dict(
                    step=step + 1,
                    fresh20=ll(fresh(g, 20, gen_fresh), xv, yv),
                    crn100=ll(crn(g)["w"], xv, yv),
                    ref2000=ll(fresh(g, 2000, gen_ref), xv, yv),
                    test500=ll(fresh(g, 500, gen_ref), data.x_test, data.y_test),
                )
            )

    with pyro.get_param_store().scope():
        g = AutoNormal(bnn, init_scale=0.01, init_loc_fn=init_to_network(bnn, seed=0))
        fit_svi(
            bnn,
            g,
            data.x_train,
            data.y_train,
            num_steps=args.steps,
            lr=args.lr,
            batch_size=128,
            seed=0,
            progress=True,
            loss=ClosedFormKLElbo(("w",), num_particles=20, max_plate_nesting=1),
            callback=lambda step, value: check(step, g),
        )
    a = np.array([[r[k] for k in RULES] for r in rows])
    print(f"{args.dataset}, lr {args.lr:g}, {len(rows)} checks")
    for i, k in enumerate(RULES):
        best_i, stop_i = stop_at(list(a[:, i]))
        jitter = np.sqrt(np.mean(np.diff(a[20:, i]) ** 2))
        print(
            f"  {k:8s} corr with ref2000 {np.corrcoef(a[:, i], a[:, 2])[0, 1]:.3f}, "
            f"offset {np.mean(a[:, i] - a[:, 2]):+.2f}, jitter {jitter:.2f} | keeps step {rows[best_i]['step']} "
            f"(stops {rows[stop_i]['step']}): ref2000 {rows[best_i]['ref2000']:.3f}, test {rows[best_i]['test500']:.3f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()

"""Cost and quality of the k-NN ELBOs' settings on the cosine toy (issue 20).

    python docs/bench/knn_elbo_presets.py [--steps 3000] [--rounds 7] [--out docs/results/knn-elbo-presets.csv]

The reproduce hyvi-cosine setting (1x50 tanh, prior N(0, 0.5), noise 0.1, Adam 0.005, minibatches
of 50, hypernet guide; FuNN-HyVI's nu = U[-4, 2], T = 50). Cost: milliseconds per SVI step, the
settings interleaved (each round times 20 steps of every setting in turn; median over rounds; one
torch thread), and its ratio to MFVI's step (AutoNormal + Trace_ELBO). Quality: one full fit of
``--steps`` steps per setting: the mean predictive sd of f in the data, the gap [-0.4, 0.4] and
far out, and test LL (500 posterior draws).
"""

import argparse
import time

import numpy as np
import pandas as pd
import pyro
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.reproduce.hyvi import PRIOR_SCALE, _region_sd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = pb.load_dataset("cosine", seed=0)
    x, y = data.x_train, data.y_train
    model = pb.BNN(pb.MLP(1, [50], 1, activation="tanh"), prior_scale=PRIOR_SCALE, noise_scale=0.1)
    nu = pyro.distributions.Uniform(torch.tensor([-4.0]), torch.tensor([2.0])).to_event(1)
    settings = {
        "MFVI": lambda: Trace_ELBO(),
        "NN-HyVI default": lambda: pb.KNNElbo(),
        "NN-HyVI fast": lambda: pb.KNNElbo.fast(),
        "FuNN-HyVI default": lambda: pb.FunctionalKNNElbo(input_dist=nu),
        "FuNN-HyVI fast": lambda: pb.FunctionalKNNElbo.fast(input_dist=nu),
    }

    def guide_for(name):
        init = pb.init_to_network(model, seed=0)
        return (
            AutoNormal(model, init_scale=0.01, init_loc_fn=init)
            if name == "MFVI"
            else pb.HypernetGuide(model, init_loc_fn=init, init_scale=0.05)
        )

    # cost: interleaved rounds of 20 steps each, every setting in its own param store
    stores, svis, times = {}, {}, {name: [] for name in settings}
    for name, make in settings.items():
        with pyro.get_param_store().scope() as store:
            svis[name] = pyro.infer.SVI(model, guide_for(name), pyro.optim.Adam({"lr": 0.005}), make())
            svis[name].step(x, y, batch_size=50)  # set up parameters
        stores[name] = store
    for _ in range(args.rounds):
        for name, svi in svis.items():
            with pyro.get_param_store().scope(stores[name]):
                t0 = time.perf_counter()
                for _ in range(20):
                    svi.step(x, y, batch_size=50)
                times[name].append((time.perf_counter() - t0) / 20 * 1e3)
    ms = {name: float(np.median(v)) for name, v in times.items()}
    print({k: round(v, 2) for k, v in ms.items()}, flush=True)

    rows = []
    for name, make in settings.items():
        with pyro.get_param_store().scope():
            guide = guide_for(name)
            pb.fit_svi(
                model, guide, x, y, num_steps=args.steps, lr=0.005, batch_size=50, seed=0, loss=make(), progress=False
            )
            w = pb.sample_posterior(model, guide, x, num_samples=500, seed=0)["w"]
        ll = float(pb.evaluate(model, {"w": w}, data.x_test, data.y_test)["test_ll"])
        rows.append(
            {
                "setting": name,
                "ms_per_step": ms[name],
                "cost_vs_mfvi": ms[name] / ms["MFVI"],
                **_region_sd(model, w),
                "test_ll": ll,
            }
        )
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows).set_index("setting")
    print(table.round(3).to_string())
    if args.out:
        table.to_csv(args.out)


if __name__ == "__main__":
    main()

# K-FAC against the full GGN (and diag, last layer) on digits-ood networks small enough for the full
# GGN: MLP 64-32-5 and a 4-channel CNN, seed 0, prior precision fixed and by marginal likelihood.
# Run: OMP_NUM_THREADS=1 python docs/bench/kfac_vs_full_ggn_digits.py
import torch, torch.nn as nn, pyro_bnnlv as pb

torch.set_num_threads(1)
data = pb.load_dataset("digits-ood", seed=0)
for kind in ("mlp", "cnn"):
    torch.manual_seed(0)
    if kind == "mlp":
        net = pb.MLP(64, [32], 5, activation="relu")
    else:
        net = pb.ModuleNet(
            nn.Sequential(
                nn.Unflatten(1, (1, 8, 8)),
                nn.Conv2d(1, 4, 3),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(4 * 36, 16),
                nn.ReLU(),
                nn.Linear(16, 5),
            ),
            64,
            5,
        )
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, omega=1.0), likelihood="categorical")
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=1500, lr=0.01, seed=0, progress=False)
    print(kind, net.num_weights, "MAP", pb.evaluate(model, {"w": w[None]}, data).round(4).to_dict(), flush=True)
    for s in ("full", "kfac", "diag", "last_layer"):
        la = pb.LinearizedLaplace(model, w, structure=s).fit(data.x_train, data.y_train)
        fixed = pb.evaluate(model, la, data).round(4).to_dict()
        h = la.optimize_hyperparameters()
        print(
            f"  {s:10s} prior-only {fixed} | marglik {h['prior_factor']:.3g} {pb.evaluate(model, la, data).round(4).to_dict()}",
            flush=True,
        )

# Run: OMP_NUM_THREADS=1 python docs/bench/kfac_prior_by_validation_digits.py
# K-FAC Laplace on the digits CNN with the prior precision chosen by validation LL (probit-free MC
# predictive) against the marginal-likelihood choice and MAP, 3 seeds; the protocol of
# pyro_bnnlv.reproduce.classification.digits_fit otherwise.
import torch, math, statistics as st
import pyro_bnnlv as pb
from pyro_bnnlv.reproduce.classification import digits_cnn, DIGITS_SIZE

torch.set_num_threads(1)
rows = []
for seed in (0, 1, 2):
    data = pb.load_dataset("digits-ood", seed=seed)
    torch.manual_seed(seed)
    net = digits_cnn(data.num_classes)
    model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, omega=1.0), likelihood="categorical")
    w = pb.train_map(
        model,
        data.x_train,
        data.y_train,
        num_steps=int(DIGITS_SIZE["map_steps"]),
        lr=float(DIGITS_SIZE["lr"]),
        seed=seed,
        progress=False,
    )
    m_map = pb.evaluate(model, {"w": w[None]}, data)
    la = pb.LinearizedLaplace(model, w, structure="kfac").fit(data.x_train, data.y_train)
    ml = la.optimize_hyperparameters()
    m_ml = pb.evaluate(model, la, data)
    la2 = pb.LinearizedLaplace(model, w, structure="kfac").fit(data.x_train, data.y_train)
    va = la2.optimize_hyperparameters(
        method="validation", x_valid=data.x_valid, y_valid=data.y_valid, prior_grid=10.0 ** torch.linspace(-1, 5, 25)
    )
    m_va = pb.evaluate(model, la2, data)
    rows.append((seed, m_map, m_ml, m_va, ml["prior_factor"], va["prior_factor"]))
    print(
        seed,
        "MAP",
        m_map.round(4).to_dict(),
        "\n  marglik",
        round(ml["prior_factor"], 3),
        m_ml.round(4).to_dict(),
        "\n  valid",
        round(va["prior_factor"], 3),
        m_va.round(4).to_dict(),
        flush=True,
    )
for key in ("test_ll", "ece", "brier"):
    for name, idx in (("marglik", 2), ("valid", 3)):
        d = [float(r[idx][key] - r[1][key]) for r in rows]
        print(f"{key} {name}-MAP mean {st.mean(d):+.4f} SE {st.stdev(d) / math.sqrt(len(d)):.4f}")

# Last-layer against full linearised Laplace after a MAP with a learned noise, on yacht gap splits 0-2
# (issue 40 item 3). Run: OMP_NUM_THREADS=1 python docs/bench/laplace_last_layer_gap.py
import pyro_bnnlv as pb

data = pb.load_dataset("yacht")
splits = pb.gap_splits(data)
print(len(splits), splits[0])
for k, d in enumerate(splits[:3]):
    model = pb.BNN(pb.MLP(d.input_dim, [50], 1), prior_scale=1.0, noise_scale=0.1, learn_noise=True)
    w = pb.train_map(model, d.x_train, d.y_train, num_steps=2000, seed=0, progress=False)
    for s in ("full", "last_layer"):
        la = pb.LinearizedLaplace(model, w, structure=s).fit(d.x_train, d.y_train)
        hp = la.optimize_hyperparameters()
        m = pb.evaluate(model, la, d)
        print(
            k,
            s,
            {k2: round(v, 3) for k2, v in hp.items()},
            m.round(3).to_dict(),
            "model noise",
            float(model.noise_scale),
        )

# Learned noise (mean-field VI, learn_noise=True) against the noise chosen by pb.grid_search on
# validation LL: BNN 1x50 on mcycle, 3,000 steps, 3 seeds (README, "Choose the noise by validation").
# Run: python docs/bench/learned_vs_chosen_noise.py
# learned noise (mean-field VI) vs noise chosen by validation LL, BNN 1x50 on mcycle
import torch, pyro_bnnlv as pb

torch.set_num_threads(1)
data = pb.load_dataset("mcycle", seed=0)
print(data)


def fit(data, seed, noise_scale, learn=False):
    model = pb.BNN(pb.MLP(1, [50], 1), noise_scale=noise_scale, learn_noise=learn)
    guide = pb.MeanField(model)
    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=3000, lr=0.01, seed=seed, progress=False)
    return model, guide


table = pb.grid_search(fit, data, {"noise_scale": [0.1, 0.2, 0.3, 0.5, 0.8]}, seeds=(0, 1, 2), progress=False)
print(table.attrs["ranking"])
best = table.attrs["best"]["noise_scale"]
rows = []
for seed in (0, 1, 2):
    m, g = fit(data, seed, best)
    chosen = pb.evaluate(m, g, data, seed=seed)["test_ll"]
    m2, g2 = fit(data, seed, 0.3, learn=True)
    learned = pb.evaluate(m2, g2, data, seed=seed)["test_ll"]
    rows.append((seed, chosen, learned, float(m2.noise_scale)))
    print(rows[-1])
import statistics as st

d = [r[1] - r[2] for r in rows]
print("chosen", best, "mean diff chosen-learned", st.mean(d), "SE", st.stdev(d) / len(d) ** 0.5)

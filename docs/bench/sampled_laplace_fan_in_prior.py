"""Issue 43: sampled Laplace under App. D's training with the Laplace posterior's prior N(0, 1) on
every parameter (App. D's UCI text) against N(0, 1/H) on the weights and N(0, 1) on the biases
(H the fan-in: the prior App. D states for the toy experiments), one split per set, omega = 1,
lr 0.01, 100 epochs, trained on train + validation. Run: python docs/bench/sampled_laplace_fan_in_prior.py
"""

import torch

torch.set_num_threads(1)
from pyro_bnnlv.datasets import load_dataset
from pyro_bnnlv.reproduce import app_d
from pyro_bnnlv.infer.laplace.linearized import LinearizedLaplace
from pyro_bnnlv.models.bnn import BNN, fan_in_prior_scale
from pyro_bnnlv.nets import MLP
from pyro_bnnlv.posterior import sample_posterior
from pyro_bnnlv.stats.predictive import evaluate

for name, split in [("boston", 1), ("boston", 2), ("yacht", 0), ("energy", 0), ("concrete", 0), ("wine", 0)]:
    data = load_dataset(name, split=split)
    x = torch.cat([data.x_train, data.x_valid])
    y = torch.cat([data.y_train, data.y_valid])
    net = MLP(data.input_dim, [50], 1, activation="tanh")
    w, sigma = app_d.train_map_minibatch(net, x, y, omega=1.0, lr=0.01, epochs=(100,), seed=0)[100]
    res = []
    for prior in (1.0, fan_in_prior_scale(net, omega=1.0)):
        la = LinearizedLaplace(BNN(net, prior_scale=prior, noise_scale=sigma), w).fit(x, y)
        slm = la.to_model()
        s = sample_posterior(slm, la.as_guide(), x, num_samples=100, seed=0)
        res.append(float(evaluate(slm, s, data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)["test_ll"]))
    print(name, split, "SL with N(0,1):", round(res[0], 2), " with N(0,1/H):", round(res[1], 2))

"""The benchmarks' step-by-step alternation: a fit_svi step and another step, timed in turn."""

import time

import torch

import pyro_bnnlv as pb
from pyro_bnnlv.reproduce.timing import fit_step_ms_beside


def test_fit_step_ms_beside_times_each_side_separately():
    calls = []

    def other():
        calls.append(1)
        time.sleep(0.02)

    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    model = pb.BNN(pb.MLP(1, [5], 1), noise_scale=0.3)
    ours, theirs = fit_step_ms_beside(other, model, pb.MeanField(model), x, torch.sin(3 * x[:, 0]), 30, seed=0)
    assert len(calls) == 30 + 21  # once after every step, the 20 untimed ones included
    assert theirs >= 20.0  # the sleep is inside the other side's time ...
    assert 0.0 < ours < theirs  # ... and not inside fit_svi's (a 5-unit network's step is well under 20 ms)

"""The benchmarks' alternation in blocks: fit_svi steps and another step, timed in turn."""

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
    ours, theirs = fit_step_ms_beside(other, model, pb.MeanField(model), x, torch.sin(3 * x[:, 0]), 30, block=4, seed=0)
    # once after each of the 20 untimed steps, then 4 in a row after steps 20, 24, ..., 48 (callback steps 0-based)
    assert len(calls) == 20 + 4 * len(range(20, 51, 4))
    assert theirs >= 20.0  # the sleep is inside the other side's time ...
    assert 0.0 < ours < theirs  # ... and not inside fit_svi's (a 5-unit network's step is well under 20 ms)

# The digits CNN of pyro-bnnlv reproduce classification: MAP mean confidence against accuracy at the
# fan-in prior omega = 1 and 4, and at omega = 4 K-FAC (marglik) against MAP (NLL, ECE), 3 seeds.
# Run: OMP_NUM_THREADS=1 python docs/bench/digits_map_confidence.py
import torch, pyro_bnnlv as pb
from pyro_bnnlv.reproduce.classification import digits_cnn

torch.set_num_threads(1)
for omega in (1.0, 4.0):
    for seed in (0, 1, 2):
        data = pb.load_dataset("digits-ood", seed=seed)
        torch.manual_seed(seed)
        net = digits_cnn(data.num_classes)
        model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net, omega=omega), likelihood="categorical")
        w = pb.train_map(model, data.x_train, data.y_train, num_steps=1500, lr=0.01, seed=seed, progress=False)
        p = torch.softmax(model.f(data.x_test, w), -1)
        conf = p.max(-1).values.mean().item()
        acc = (p.argmax(-1) == data.y_test).float().mean().item()
        line = f"omega={omega} seed={seed} MAP mean confidence {conf:.3f} accuracy {acc:.3f}"
        if omega == 4.0:
            la = pb.LinearizedLaplace(model, w, structure="kfac").fit(data.x_train, data.y_train)
            h = la.optimize_hyperparameters()
            m, mm = pb.evaluate(model, la, data), pb.evaluate(model, {"w": w[None]}, data)
            line += f" | MAP nll {-mm['test_ll']:.4f} ece {mm['ece']:.4f}; K-FAC(marglik {h['prior_factor']:.3g}) nll {-m['test_ll']:.4f} ece {m['ece']:.4f}"
        print(line, flush=True)

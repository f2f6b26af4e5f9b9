# Sampled Laplace (la.as_guide(): the GGN Gaussian pushed through the network) against the linearised
# predictive on the cosine toy (issue 40 item 3). Run: OMP_NUM_THREADS=1 python docs/bench/laplace_sampled_vs_linearised.py
import pyro_bnnlv as pb

data = pb.load_dataset("cosine")
model = pb.BNN(pb.MLP(1, [50], 1), prior_scale=1.0, noise_scale=0.1)
w = pb.train_map(model, data.x_train, data.y_train, num_steps=3000, seed=0, progress=False)
la = pb.LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
print(la.optimize_hyperparameters())
print("linearised", pb.evaluate(model, la, data).round(3).to_dict())
m2 = la.to_model()
print("sampled   ", pb.evaluate(m2, la.as_guide(), data, num_samples=1000, seed=0).round(3).to_dict())

"""secure_fgl from Python in a few dozen lines.

    python examples/quickstart.py

1. generate a graph and partition it into clients;
2. build a protocol object (here CKKS: the server only ever adds ciphertexts);
3. run an algorithm through the experiment API;
4. read the result and the transcript (who sent what, how many bytes).
"""

from secure_fgl.config import RunConfig
from secure_fgl.data import make_federated
from secure_fgl.experiment import run_experiment

# 1. a synthetic SBM graph with binary bag-of-words features, 5 clients by label-Dirichlet(1.0)
fed = make_federated(
    "sbm", num_clients=5, partition="dirichlet", beta=1.0, seed=0, num_nodes=1000, num_features=200, num_classes=4
)
print(
    f"{fed.num_clients} clients, sizes {[c.num_nodes for c in fed.clients]}, "
    f"cross-client edges known to client 0: {fed.clients[0].cross_edges.size(1)}"
)

# 2.+3. FedGCN (1-hop neighbour sums sent once, encrypted) then FedAvg rounds, all through CKKS
cfg = RunConfig(algorithm="fedgcn", mode="ckks", clients=5, rounds=30, seed=0, options={"hops": 1})
result = run_experiment(cfg, fed=fed, progress=False)

# 4. the result: accuracy, bytes per exchange, time per phase
print(f"test accuracy {result['final']['test_acc']:.3f} (best round {result['final']['best_round']})")
for tag, c in result["comm"]["per_tag"].items():
    print(f"  {tag:<28} up {c['bytes_up'] / 1e6:8.2f} MB   down {c['bytes_down'] / 1e6:8.2f} MB")
print("seconds:", {k: round(v, 2) for k, v in result["time"].items()})

# the same run in plaintext for comparison: same seed, same partition
plain = run_experiment(RunConfig(**{**cfg.to_dict(), "mode": "plain"}), fed=fed, progress=False)
print(f"plain test accuracy {plain['final']['test_acc']:.3f}")

"""The DP-noise regeneration attack (docs/security.md), as a plain-mode server would run it.

The victim runs DP-FedAvg for one round; the attacker reads the victim's ``result.json``
(config, seed, DP settings), reruns the same configuration and subtracts its own round-0
uploads from the victim's.  With noise drawn from the run seed the residual is 0 (the noise is
stripped exactly); with the OS-keyed generator (:mod:`protocols.csprng`) it is two independent
noises, std ``sqrt(2) sigma``: the ratio printed as ``ratio_to_sqrt2_sigma`` is ~1.

    python examples/dp_regeneration_attack.py --dataset cora --clients 3 --epsilon 8
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

import secure_fgl.experiment as experiment
from protocols import Transcript
from secure_fgl.config import RunConfig

TAG = "fedavg/model"


def run_and_capture(cfg: RunConfig):
    """Run ``cfg``; return its protocol and each client's round-0 upload as the server saw it."""
    made = []
    real, real_transcript = experiment.make_run_protocol, experiment.run_transcript
    experiment.make_run_protocol = lambda *a, **kw: made.append(real(*a, **kw)) or made[-1]
    # a run keeps payloads only for --attacks; this attacker reads the uploads the server saw itself
    experiment.run_transcript = lambda cfg: Transcript(keep_payloads="latest")
    try:
        experiment.run_experiment(cfg, progress=False)
    finally:
        experiment.make_run_protocol, experiment.run_transcript = real, real_transcript
    uploads = {
        m.sender: np.asarray(m.payload["values"], np.float64).ravel()
        for m in made[0].transcript.select(tag=TAG, round=0, receiver="server")
    }
    return made[0], uploads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="cora")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="regen-")
    cfg = RunConfig(
        algorithm="fedavg",
        mode="plain",
        dataset=args.dataset,
        clients=args.clients,
        rounds=1,
        dp_epsilon=args.epsilon,
        dp_clip=1.0,
        seed=args.seed,
        out=f"{work}/victim",
    )
    victim, seen = run_and_capture(cfg)
    with open(f"{work}/victim/result.json") as f:
        public = json.load(f)["config"]
    _, regenerated = run_and_capture(RunConfig.from_dict({**public, "out": f"{work}/attacker"}))
    sigma = victim.dp.noise_multiplier(TAG) * cfg.dp_clip
    # the plain wire pads each vector to whole 4096-value blocks with exact zeros: leave those out
    residual = np.concatenate([(seen[c] - regenerated[c])[(seen[c] != 0) | (regenerated[c] != 0)] for c in seen])
    result = {
        "dataset": args.dataset,
        "clients": args.clients,
        "epsilon": args.epsilon,
        "seed": args.seed,
        "entries": int(residual.size),
        "sigma_per_upload": sigma,
        "residual_std": float(residual.std()),
        "residual_max_abs": float(np.abs(residual).max()),
        "ratio_to_sqrt2_sigma": float(residual.std() / (np.sqrt(2) * sigma)),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Every command of the README, shortened (few rounds, small sweep), in a scratch folder.
#   SECURE_FGL_DATA=/path/to/datasets bash examples/readme_commands.sh [SCRATCH]
# Prints each command, then its last lines; stops at the first failure. The two top commands (install +
# main job, install + tests) run in CI as written (.ci/run).
set -euo pipefail
: "${SECURE_FGL_DATA:?set SECURE_FGL_DATA to the dataset folder}"
SFGL="${SFGL:-secure-fgl}"                  # e.g. SFGL="python -m secure_fgl.cli.main" inside a checkout
SCRATCH="${1:-$(mktemp -d)}"
EXAMPLES="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$SCRATCH"
cd "$SCRATCH"
SHORT=(--rounds 2 --quiet)

step() { echo "\$ $*"; local t0=$SECONDS; "$@" 2>&1 | tail -n "${TAIL:-4}"; echo "  ($((SECONDS - t0)) s)"; }

cat > run.toml <<'TOML'
algorithm = "fedgcn"
dataset = "sbm"
clients = 5
mode = "ckks"
rounds = 2
[options]
hops = 2
TOML

step $SFGL run "${SHORT[@]}" --out runs/main
step $SFGL run --algorithm fedavg --dataset cora --clients 10 --mode mask --out runs/cora-fedavg "${SHORT[@]}"
step $SFGL run --preset fedgcn-table2 --dataset citeseer --mode ckks "${SHORT[@]}" --out runs/preset
step $SFGL run --algorithm fedgcn-gap --mode mask --dp-epsilon 4 --dataset citeseer "${SHORT[@]}" --out runs/dp
step $SFGL run --mode ckks-mp --clients 10 --threshold 7 "${SHORT[@]}" --out runs/threshold
step $SFGL run --config run.toml --quiet --out runs/config
step $SFGL run --executor local --mode mask "${SHORT[@]}" --out runs/local
step $SFGL run --executor ray --ray-num-cpus 2 --ray-workers 2 --mode ckks "${SHORT[@]}" --out runs/ray
# docs/runtime.md's two-machine walkthrough on one machine: one node declaring both sites
step ray start --head --port=6390 --num-cpus=2 --include-dashboard=false --resources '{"site_a": 1, "site_b": 1}'
step $SFGL run --algorithm fedavg --mode mask --clients 3 --executor ray --ray-address auto \
    --ray-client-resources "site_a:0,1;site_b:2" "${SHORT[@]}" --out runs/ray-pinned
step ray stop
step $SFGL run --out runs/main --resume --rounds 3 --quiet
step $SFGL run --attacks all "${SHORT[@]}" --out runs/attacks
step bash "$EXAMPLES/flower_local.sh"           # needs the flower extra; a secure FedGCN run of one round
TAIL=2 step $SFGL run --help
step $SFGL algorithms
TAIL=8 step $SFGL algorithms fedgcn
step $SFGL attacks
step $SFGL modes
TAIL=30 step $SFGL datasets
TAIL=10 step $SFGL compare runs/
step $SFGL plot runs/cora-fedavg
step $SFGL report --algorithms fedgcn-gap --datasets sbm --modes plain,ckks,mask --dp-epsilons inf,8 --seeds 1 \
    --rounds 2 --quiet --out runs/report
step python - <<'PY'
import torch
from secure_fgl.results import load_runs
from secure_fgl.engine.hooks import load_best_model
df = load_runs("runs/")
print(len(df), "runs;", df.groupby("config.mode")["final.test_acc"].mean().round(3).to_dict())
weights = torch.load("runs/cora-fedavg/best_model.pt", weights_only=True)
print(len(weights), "tensors in best_model.pt")
PY
echo "all README commands ran in $SCRATCH"

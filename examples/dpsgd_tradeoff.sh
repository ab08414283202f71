#!/usr/bin/env bash
# Sample-level DP-SGD (fedgcn-gap --dpsgd) vs epsilon on the built-in graph, in plain mode (each
# client adds all of each step's noise) and mask mode (one SGD step per round: the noise is split
# over the clients inside the secure model mean), 3 seeds; then the report (tables, figures).
#   bash examples/dpsgd_tradeoff.sh [OUT]          # default runs/dpsgd; finished runs are skipped
#   EPSILONS="inf 16 32 64" MODES=mask bash examples/dpsgd_tradeoff.sh [OUT]   # a part of the grid
# docs/dp.md, "Record-level DP-SGD", has the results.  "inf" is the same pipeline without DP-SGD
# (no clipping, no noise; lr 1, since lr 5 without clipping diverges).
set -euo pipefail
OUT=${1:-runs/dpsgd}
SFGL=${SFGL:-secure-fgl}
COMMON="--algorithm fedgcn-gap --dataset sbm --model mlp --hidden 16 --clients 10 --rounds 50 --local-epochs 1
        --optimizer sgd --lr 5 --attacks membership,link_posterior --quiet"
EPSILONS=${EPSILONS:-inf 4 8 16 32 64}
MODES=${MODES:-mask plain}
# shellcheck disable=SC2086
for seed in 0 1 2; do for mode in $MODES; do for eps in $EPSILONS; do
  name=fedgcn-gap_sbm_${mode}_eps-${eps}_s${seed}
  [ -f "$OUT/$name/result.json" ] && continue
  if [ "$eps" = inf ]; then dp="--lr 1"; else dp="--dpsgd --dp-epsilon $eps"; fi
  # shellcheck disable=SC2086
  $SFGL run $COMMON --mode "$mode" --seed "$seed" $dp --out "$OUT/$name" | grep "test accuracy" | sed "s/^/$name /"
done; done; done
$SFGL report --no-run --out "$OUT" --title "fedgcn-gap, sample-level DP-SGD, built-in graph"

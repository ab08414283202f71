#!/usr/bin/env bash
# A secure run through Flower on one machine: a SuperLink (TLS, SuperNode authentication), one
# site per client (each a secure-fgl client process with its own identity key and a SuperNode
# with its own registered node key) on 127.0.0.1, the run manifest built from the sites' public
# keys and checked by each site, then `secure-fgl run --executor flower`.  Everything it starts
# is stopped on exit.
#
#   pip install -e ".[flower]"
#   bash examples/flower_local.sh [RUN.toml [more secure-fgl run flags]]   # default: FedGCN, mask, Cora, 3 clients, 1 round
#   FLOWER_SITES=2 bash examples/flower_local.sh run.toml                  # 2 sites holding the clients round-robin
#   FLOWER_CLIENT_DATA=DIR bash examples/flower_local.sh run.toml          # each site holds only DIR/client<k>.npz
#                                                                          # (secure-fgl partition export --out DIR)
#
# RUN.toml holds the run's settings (the manifest hashes them); the flags after it may only set
# where the run executes and writes (e.g. --round-timeout).  Each "site" folder stands for one
# organisation's machine: its keys, its data folder, its state.
set -euo pipefail
export FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# how often the SuperLink's executor looks for a new ServerApp task (Flower's default: 1 s)
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.25}"
WORK="$(mktemp -d -t secure-fgl-flower-XXXXXX)"
PORT="${FLOWER_PORT:-39093}"
DATA="${SECURE_FGL_DATA:-}"
PARTS="${FLOWER_CLIENT_DATA:+$(realpath "$FLOWER_CLIENT_DATA")}"
SITE_DATA=()  # where a site reads the dataset from; nothing when it holds only its exported parts
[ -z "$PARTS" ] && [ -n "$DATA" ] && SITE_DATA=(--data-root "$DATA")
CONFIG="${1:-}"
[ $# -gt 0 ] && shift
if [ -z "$CONFIG" ]; then
    CONFIG="$WORK/run.toml"
    printf 'algorithm = "fedgcn"\ndataset = "cora"\nclients = 3\nmode = "mask"\nrounds = 1\n' > "$CONFIG"
fi
CONFIG="$(realpath "$CONFIG")"
CLIENTS="$(python -c 'import argparse, sys
from secure_fgl.cli.main import config_from_args
print(config_from_args(argparse.Namespace(config=sys.argv[1], preset=None)).clients)' "$CONFIG")"
SITES="${FLOWER_SITES:-$CLIENTS}"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# --- the aggregator: a CA and the SuperLink's certificate for 127.0.0.1 (in a deployment: your PKI)
mkdir -p "$WORK/aggregator"
cd "$WORK/aggregator"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "/CN=secure-fgl CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
    -keyout superlink.key -out superlink.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' > san.ext
openssl x509 -req -in superlink.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext \
    -out superlink.crt 2>/dev/null
export FLWR_HOME="$WORK/aggregator/flwr-home"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "deployment"

[superlink.deployment]
address = "127.0.0.1:$PORT"
root-certificates = "$WORK/aggregator/ca.crt"
TOML
flower-superlink --host 127.0.0.1 --port "$PORT" --ssl-ca-certfile ca.crt --ssl-certfile superlink.crt \
    --ssl-keyfile superlink.key --enable-supernode-auth --disable-runtime-dependency-installation \
    > superlink.log 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.2; done

# --- identity keys: the aggregator's and each site's (only their fingerprints leave), then the
#     run manifest built from them by the operator
secure-fgl keys new --out "$WORK/aggregator/keys" > /dev/null
PARTIES=(--party "server=$(secure-fgl keys show "$WORK/aggregator/keys/identity.key")")
for K in $(seq 0 $((CLIENTS - 1))); do
    S=$((K % SITES))
    secure-fgl keys new --out "$WORK/site$S/keys/client$K" > /dev/null
    PARTIES+=(--party "client$K=$(secure-fgl keys show "$WORK/site$S/keys/client$K/identity.key")")
done
secure-fgl manifest new --config "$CONFIG" "${PARTIES[@]}" --out "$WORK/aggregator/manifest.json"

# --- each site: its node key (the public half registered with the SuperLink), its check of the
#     manifest (and, in a deployment, of its comparison code with the other sites), its client
#     process holding its clients' identity keys and running its ClientApp tasks (--clientappio: no
#     process per message), its SuperNode (--isolation process: it starts no ClientApp process)
for S in $(seq 0 $((SITES - 1))); do
    SITE="$WORK/site$S"
    cp "$WORK/aggregator/manifest.json" "$SITE/manifest.json"                # sent by the operator
    ARGS=()
    for K in $(seq "$S" "$SITES" $((CLIENTS - 1))); do
        secure-fgl manifest verify "$SITE/manifest.json" --config "$CONFIG" --key "$SITE/keys/client$K" \
            --as "client$K" > /dev/null
        ARGS+=(--client "$K" --identity-key "$SITE/keys/client$K" ${PARTS:+--client-data "$PARTS/client$K.npz"})
    done
    ssh-keygen -q -t ecdsa -b 384 -N "" -f "$SITE/node.key"
    flwr supernode register "$SITE/node.key.pub" deployment > /dev/null     # run by the aggregator
    python -m secure_fgl.runtime.flower_site --socket "$SITE/run/site.sock" "${ARGS[@]}" \
        "${SITE_DATA[@]}" --state-dir "$SITE/state" \
        --manifest "$SITE/manifest.json" --clientappio "127.0.0.1:$((PORT + 10 + S))" > "$SITE/site.log" 2>&1 &
    PIDS+=($!)
    flower-supernode --superlink "127.0.0.1:$PORT" --root-certificates "$WORK/aggregator/ca.crt" \
        --auth-supernode-private-key "$SITE/node.key" --port $((PORT + 10 + S)) --isolation process \
        --node-config "site-socket=\"$SITE/run/site.sock\"" > "$SITE/supernode.log" 2>&1 &
    PIDS+=($!)
done

# --- the run, from the aggregator's machine (the driver submits the Flower app to the SuperLink)
cd "$WORK/aggregator"
secure-fgl run --config "$CONFIG" --executor flower --save-best-model false --round-timeout 300 \
    --manifest manifest.json --identity-key keys/identity.key --out "$WORK/run" "$@"
echo "run folder: $WORK/run (logs of the SuperLink and each site under $WORK)"

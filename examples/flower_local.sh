#!/usr/bin/env bash
# A secure run through Flower on one machine: a SuperLink (TLS, SuperNode authentication), three
# sites (each a secure-fgl client process and a SuperNode with its own registered key) on
# 127.0.0.1, then `secure-fgl run --executor flower`.  Everything it starts is stopped on exit.
#
#   pip install -e ".[flower]"
#   bash examples/flower_local.sh [secure-fgl run flags, replacing the default]     # default: FedGCN, mask, Cora, 3 clients, 1 round
#   FLOWER_SITES=10 bash examples/flower_local.sh --clients 10 ...                  # one site per client
#
# Each "site" folder stands for one organisation's machine: its key, its data folder, its state.
set -euo pipefail
export FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
WORK="$(mktemp -d -t secure-fgl-flower-XXXXXX)"
PORT="${FLOWER_PORT:-39093}"
SITES="${FLOWER_SITES:-3}"
DATA="${SECURE_FGL_DATA:-}"
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
    --database "$WORK/aggregator/state.db" > superlink.log 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.2; done

# --- each site: its node key (the public half registered with the SuperLink), its client process, its SuperNode
for K in $(seq 0 $((SITES - 1))); do
    SITE="$WORK/site$K"
    mkdir -p "$SITE"
    ssh-keygen -q -t ecdsa -b 384 -N "" -f "$SITE/node.key"
    flwr supernode register "$SITE/node.key.pub" deployment > /dev/null     # run by the aggregator
    python -m secure_fgl.runtime.flower_site --socket "$SITE/run/site.sock" --client "$K" \
        ${DATA:+--data-root "$DATA"} --state-dir "$SITE/state" > "$SITE/site.log" 2>&1 &
    PIDS+=($!)
    flower-supernode --superlink "127.0.0.1:$PORT" --root-certificates "$WORK/aggregator/ca.crt" \
        --auth-supernode-private-key "$SITE/node.key" --port $((PORT + 10 + K)) \
        --node-config "site-socket=\"$SITE/run/site.sock\"" > "$SITE/supernode.log" 2>&1 &
    PIDS+=($!)
done

# --- the run, from the aggregator's machine (the driver submits the Flower app to the SuperLink)
cd "$WORK/aggregator"
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--algorithm fedgcn --dataset cora --clients 3 --mode mask --rounds 1)
secure-fgl run --executor flower --save-best-model false --round-timeout 300 --out "$WORK/run" "${ARGS[@]}"
echo "run folder: $WORK/run (logs of the SuperLink and each site under $WORK)"

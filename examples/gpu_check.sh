#!/bin/bash
# The device checks in one call, for a session that is lent a GPU machine (the tool library's
# `device`): the gpu-marked tests, the overhead bench on CUDA and on that machine's CPU, and the
# FedGCN runs that need more memory than the 2-core CI machine has (Physics 1-hop / 2-hop, CS 2-hop,
# plain beside mask).  Everything stops at END seconds; the results come back as $OUT/runs.jsonl
# (examples/fedgcn_amazon_coauthor.py rows) and $OUT/gpu_check.tgz (logs, the bench JSON, a memory trace).
#
# Prepare here (both folders are ignored; name them in `carry`):
#   echo /.whl/ >> .git/info/exclude; echo /.data/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl tenseal==0.3.18 opacus==1.6.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 dtaidistance==2.5.1
#   mkdir -p .data && cp -r ../shared/datasets/{CS,Physics,Cora} .data/
# Run (device tool): command `END=500 bash examples/gpu_check.sh`, carry [".data", ".whl"], timeout_s 570.
# Dry run here: DEV=cpu ROUNDS=2 BIG=cora SMALL=cora END=120 OUT=/tmp/x bash examples/gpu_check.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
DEV=${DEV:-cuda}; ROUNDS=${ROUNDS:-100}; BIG=${BIG:-physics}; SMALL=${SMALL:-cs}; END=${END:-495}
L=/tmp/gpu_check/logs; R=/tmp/gpu_check/res; mkdir -p $L $R
finish() { kill $SAMPLER 2>/dev/null; cat $L/jobs.txt 2>/dev/null; for f in $R/*/runs.jsonl; do cat $f; done > $OUT/runs.jsonl 2>/dev/null
           python3 -c "import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(r['dataset'],r['method'],r['mode'],r['seed'],r['device'],round(r['test_acc'],4),int(r['seconds']),'s',round(r['peak_rss_gb'],1),'GB')" $OUT/runs.jsonl
           tar czf $OUT/gpu_check.tgz -C /tmp/gpu_check . ; echo "done at $(el) s"; }
if [ "$DEV" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $L/pip.log 2>&1 || { tail -5 $L/pip.log; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD
fi
export SECURE_FGL_DATA=$PWD/.data PYTHONUNBUFFERED=1
(nvidia-smi; nproc; free -g; python3 -c "import torch,torch_geometric,tenseal,opacus,cryptography,dtaidistance; print('versions', torch.__version__, torch_geometric.__version__, torch.cuda.is_available())") > $L/env.txt 2>&1
grep versions $L/env.txt
timeout 120 python3 -m secure_fgl.cli.main run --algorithm fedgcn --dataset sbm --clients 3 --rounds 2 --mode mask --device $DEV --quiet --out /tmp/smoke > $L/smoke.log 2>&1 || { tail -30 $L/smoke.log; finish; exit 4; }
echo "smoke ok at $(el) s"
( while true; do echo "$(el) $(free -m | awk '/Mem:/{print $3}') $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null | tr -d ' ')"; sleep 5; done ) > $L/mem.log 2>&1 &
SAMPLER=$!
DL=$(( END - $(el) ))
job() { local name=$1; shift; OMP_NUM_THREADS=3 timeout $DL python3 examples/fedgcn_amazon_coauthor.py --device $DEV --rounds $ROUNDS "$@" --out $R/$name > $L/$name.log 2>&1; echo "$name rc $? at $(el) s" >> $L/jobs.txt; }
job big2_plain --datasets $BIG --seeds 0 --methods 2-hop --secure none & JOBS+=($!)
job big2_mask --datasets $BIG --seeds 0 --methods 2-hop --secure mask --no-plain & JOBS+=($!)
job big1 --datasets $BIG --seeds 0 --methods 1-hop --secure mask & JOBS+=($!)
job small2_plain --datasets $SMALL --seeds 0,1,2 --methods 2-hop --secure none & JOBS+=($!)
job small2_mask --datasets $SMALL --seeds 0,1,2 --methods 2-hop --secure mask --no-plain & JOBS+=($!)
timeout 200 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rs tests/test_gpu.py > $L/pytest_gpu.log 2>&1; echo "pytest rc $? at $(el) s" >> $L/jobs.txt
tail -3 $L/pytest_gpu.log
for d in $DEV cpu; do
  LEFT=$(( END - 20 - $(el) )); [ $LEFT -gt 10 ] || break
  timeout $LEFT python3 -m secure_fgl.bench.overhead --workloads cora-fedgcn --modes plain mask ckks --quick --sizes --no-arxiv --device $d --data-root $PWD/.data --out $L/overhead_$d > $L/overhead_$d.log 2>&1
  echo "overhead $d rc $? at $(el) s" >> $L/jobs.txt
done
wait "${JOBS[@]}"
finish

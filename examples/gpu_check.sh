#!/bin/bash
# The GPU checks in one call, on a CUDA machine that receives a copy of this working tree: the
# gpu-marked tests, the overhead bench on CUDA, the FedGCN runs that need more memory than the 2-core
# CI machine has (2-hop on BIG, plain beside mask), and GCFL's mix setting (Table 4, 13 clients, one
# process per method).  Everything stops at END seconds.
# Results come back as $OUT/runs.jsonl (examples/fedgcn_amazon_coauthor.py rows), $OUT/gpu_check.tgz
# (logs, the bench JSON, a memory trace) and $OUT/gc_<method>.tgz (each GCFL run's folder: result.json,
# or its checkpoint.pt when the deadline stopped it: rerun the same examples/gcfl_tables.py command
# beside it, here, to finish it).
#
# Prepare here (both folders are git-ignored; copy them to the GPU machine with the tree):
#   echo /.whl/ >> .git/info/exclude; echo /.data/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl tenseal==0.3.18 opacus==1.6.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 dtaidistance==2.5.1
#   mkdir -p .data/_archives && cp -r "$SECURE_FGL_DATA"/{CS,Physics,Cora} .data/
#   cp "$SECURE_FGL_DATA"/_archives/COLLAB.tar.xz .data/_archives/
#   (cd "$SECURE_FGL_DATA" && tar cJf - MUTAG BZR COX2 DHFR PTC_MR AIDS NCI1 ENZYMES DD PROTEINS \
#     IMDB-BINARY IMDB-MULTI) > .data/tu.tar.xz        # the TU text files travel compressed (64 MiB limit)
# Run there: `END=560 OUT=<results folder> bash examples/gpu_check.sh` (END: seconds it may take in all).
# Dry run here: DEV=cpu ROUNDS=2 GC_ROUNDS=2 BIG=cora END=240 OUT="$(mktemp -d)" bash examples/gpu_check.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
DEV=${DEV:-cuda}; ROUNDS=${ROUNDS:-100}; GC_ROUNDS=${GC_ROUNDS:-200}; BIG=${BIG:-physics}; END=${END:-495}
GC_SETTING=${GC_SETTING:-mix}; GC_METHODS=${GC_METHODS:-self-train FedAvg FedProx GCFL GCFL+}
W=${GPU_CHECK_DIR:-$(mktemp -d)}  # scratch folder of this check
L=$W/logs; R=$W/res; mkdir -p $L $R
finish() { kill $SAMPLER 2>/dev/null; cat $L/jobs.txt 2>/dev/null; for f in $R/*/runs.jsonl; do cat $f; done > $OUT/runs.jsonl 2>/dev/null
           python3 -c "import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(r['dataset'],r['method'],r['mode'],r['seed'],round(r['test_acc'],4),int(r['seconds']),'s',round(r['peak_rss_gb'],1),'GB')" $OUT/runs.jsonl
           for f in $R/gc_*/*/*/seed*/result.json; do [ -f "$f" ] && python3 -c "import json,sys
r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-3], r['final']['test_acc'], round(r['time']['total']), 's')" $f; done
           tar czf $OUT/gpu_check.tgz -C $W --exclude=./data --exclude=./cache --exclude='./res/gc_*' .
           # one file per GCFL method: the 16 MiB limit per returned file (clients/ holds the runtimes' state)
           for d in $R/gc_*; do [ -d "$d" ] && tar czf $OUT/$(basename "$d" | tr '+' 'p').tgz -C $R $(basename "$d"); done
           echo "done at $(el) s"; }
if [ "$DEV" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $W/site .whl/*.whl > $L/pip.log 2>&1 || { tail -5 $L/pip.log; exit 3; }
  export PYTHONPATH=$W/site:$PWD
fi
D=$W/data; mkdir -p $D; ln -sf $PWD/.data/* $D/; [ -f .data/tu.tar.xz ] && tar xJf .data/tu.tar.xz -C $D
export SECURE_FGL_DATA=$D SECURE_FGL_CACHE=$W/cache PYTHONUNBUFFERED=1
(nvidia-smi; nproc; free -g; python3 -c "import torch,torch_geometric,tenseal,opacus,cryptography,dtaidistance; print('versions', torch.__version__, torch_geometric.__version__, torch.cuda.is_available())") > $L/env.txt 2>&1
grep versions $L/env.txt
smoke() { timeout 120 python3 -m secure_fgl.cli.main run "$@" --rounds 2 --device $DEV --quiet --out $W/smoke_$1$2$3$4 > $L/smoke.log 2>&1 || { tail -30 $L/smoke.log; finish; exit 4; }; }
smoke --algorithm fedgcn --dataset sbm --clients 3 --mode mask
smoke --algorithm gcflplus --dataset synthetic-graphs --clients 4 --mode plain
echo "smoke ok at $(el) s"
( while true; do echo "$(el) $(free -m | awk '/Mem:/{print $3}') $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null | tr -d ' ')"; sleep 5; done ) > $L/mem.log 2>&1 &
SAMPLER=$!
fedgcn() { local name=$1; shift; OMP_NUM_THREADS=3 timeout $(( END - $(el) )) python3 examples/fedgcn_amazon_coauthor.py --device $DEV --rounds $ROUNDS "$@" --out $R/$name > $L/$name.log 2>&1; echo "$name rc $? at $(el) s" >> $L/jobs.txt; }
gcfl() { OMP_NUM_THREADS=2 timeout $(( END - $(el) )) python3 examples/gcfl_tables.py --data-root $D --settings $GC_SETTING --seeds 0 --rounds $GC_ROUNDS --methods "$1" --out $R/gc_$1 > $L/gc_$1.log 2>&1; echo "gcfl $1 rc $? at $(el) s" >> $L/jobs.txt; }
# GCFL's data are processed into the cache once (CPU only), then one process a method starts
if [ -n "$GC_METHODS" ]; then
  ( python3 -c "import sys, argparse; sys.path[:0] = ['examples']; import gcfl_tables
from secure_fgl.experiment import load_federation
load_federation(gcfl_tables.config('$GC_SETTING', 'FedAvg', 'plain', 0, argparse.Namespace(rounds=1, data_root='$D', device='cpu', attacks=[])).validate())" > $L/gc_prep.log 2>&1
    echo "gcfl data ready at $(el) s" >> $L/jobs.txt
    for m in $GC_METHODS; do gcfl $m & done; wait ) & JOBS+=($!)
fi
# the tests and timings first, on an otherwise idle GPU
timeout 200 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rs tests/attacks/test_gpu.py > $L/pytest_gpu.log 2>&1; echo "pytest rc $? at $(el) s" >> $L/jobs.txt
tail -3 $L/pytest_gpu.log
timeout 150 python3 -m secure_fgl.bench.overhead --workloads cora-fedgcn --modes plain mask ckks --quick --sizes --no-arxiv --device $DEV --data-root $D --out $L/overhead_$DEV > $L/overhead_$DEV.log 2>&1
echo "overhead $DEV rc $? at $(el) s" >> $L/jobs.txt
python3 -c "from secure_fgl.data import load_node_dataset; load_node_dataset('$BIG', '$D')" > $L/prep_big.log 2>&1 || tail -5 $L/prep_big.log
fedgcn big2_plain --datasets $BIG --seeds 0 --methods 2-hop --secure none & JOBS+=($!)
fedgcn big2_mask --datasets $BIG --seeds 0 --methods 2-hop --secure mask --no-plain & JOBS+=($!)
wait "${JOBS[@]}"
finish

#!/bin/bash
# 4x H200: the selection kernel (e97b6e3): its GPU tests, kernel_bench --selection, and the N=32 steady state
# as shipped, this tree (new) vs f8d69a3's moe.py / moe_decode.py (base), alternating on one machine
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L
git log --oneline -1 2>/dev/null; echo "tree: $(cat gpu_base_tmp/TREE)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rA tests/test_thinker_kernels.py 2>&1 | tail -40
timeout 120 python3 bench/kernel_bench.py --out $OUT/kernel --batches 16 --selection 16,24,64,512 2>&1 | grep -E "selection|Error|error" | head -20
rm -rf /tmp/base && mkdir /tmp/base && cp -r bench realtime_ming configs pyproject.toml .turns /tmp/base/ \
  && cp gpu_base_tmp/moe.py /tmp/base/realtime_ming/model/moe.py \
  && cp gpu_base_tmp/moe_decode.py /tmp/base/realtime_ming/model/kernels/moe_decode.py
C=configs/ming-flash-omni-2.0-h200x4.yaml
for v in ${ORDER:-new base new}; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d STEPS=steady STEADY_TIMEOUT_S=140 STEADY="$v$RANDOM:${SETS:-}" bash bench/gpu_tp2.sh $OUT/$v x $C 2>&1 | sed "s/^/$v /" | grep -v "^$v *$" | tail -8)
done
for f in $OUT/*/steady-*/engine_bench.md; do echo "== $f"; grep -E "^\| 32 " $f | head -4; done
gzip -r $OUT 2>/dev/null; true

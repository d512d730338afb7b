#!/bin/bash
# 4x H200: the N=32 steady state as shipped, this tree (new) and with HEAD~'s DiT files (base), alternating
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L
rm -rf /tmp/base && mkdir /tmp/base && cp -r bench realtime_ming configs pyproject.toml .turns /tmp/base/ && cp gpu_base_tmp/dit.py /tmp/base/realtime_ming/model/dit.py && cp gpu_base_tmp/dit_attention.py /tmp/base/realtime_ming/model/kernels/dit_attention.py
C=configs/ming-flash-omni-2.0-h200x4.yaml
for v in ${ORDER:-new base new}; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d STEPS=steady STEADY_TIMEOUT_S=150 STEADY="$v$RANDOM:" bash bench/gpu_tp2.sh $OUT/$v x $C 2>&1 | sed "s/^/$v /")
done
for f in $OUT/*/steady-*/engine_bench.md; do echo "== $f"; grep -E "^\| (32|N|level)" $f | head -4; done

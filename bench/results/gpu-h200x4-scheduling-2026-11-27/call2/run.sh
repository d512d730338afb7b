#!/bin/bash
# 4x H200: the N=32 steady state as shipped, this tree (new: commands applied while the thinker step runs) and
# HEAD's engine.py / admission.py / engine_bench.py (base), alternating on one machine
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L
rm -rf /tmp/base && mkdir /tmp/base && cp -r bench realtime_ming configs pyproject.toml .turns /tmp/base/ \
  && cp gpu_base_tmp/engine.py gpu_base_tmp/admission.py /tmp/base/realtime_ming/engine/ \
  && cp gpu_base_tmp/engine_bench.py /tmp/base/bench/engine_bench.py
C=configs/ming-flash-omni-2.0-h200x4.yaml
for v in ${ORDER:-new base new base}; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d STEPS=steady STEADY_TIMEOUT_S=140 STEADY="$v$RANDOM:${SETS:-}" bash bench/gpu_tp2.sh $OUT/$v x $C 2>&1 | sed "s/^/$v /")
done
for f in $OUT/*/steady-*/engine_bench.md; do echo "== $f"; grep -E "^\| 32 " $f | head -4; done
gzip -r $OUT 2>/dev/null; true

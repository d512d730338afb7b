#!/bin/bash
# one device call: talker kernel tests, the DiT attention sweep, the talker step before/after
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L
python3 bench/dit_attention_bench.py --out $OUT/attn 2>&1 | tee $OUT/attn.log | cut -c1-200
rm -rf /tmp/base && mkdir /tmp/base && cp -r bench realtime_ming tests pyproject.toml /tmp/base/ && cp gpu_base_tmp/dit.py /tmp/base/realtime_ming/model/dit.py && cp gpu_base_tmp/dit_attention.py /tmp/base/realtime_ming/model/kernels/dit_attention.py
for v in new base new base; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d python3 bench/gpu_bench.py --out $OUT/$v-$RANDOM --stages talker --reps 20 --talker-buckets ${BUCKETS:-4,6,8,12,16} 2>&1 | grep "talker B=" | sed "s/^/$v /")
done
timeout 300 python3 -m pytest -rA -q -p no:cacheprovider tests/test_fused_kernels.py tests/test_gpu_talker_runner.py tests/test_gpu_talker_pool.py tests/test_gpu_talker_process.py tests/test_gpu_speculation_bound.py tests/test_talker_cfm.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head

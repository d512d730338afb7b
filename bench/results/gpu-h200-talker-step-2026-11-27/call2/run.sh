#!/bin/bash
# one device call (2 GPUs): the talker step before/after on cuda:0, its kernels at 6 rows, every GPU test
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L
rm -rf /tmp/base && mkdir /tmp/base && cp -r bench realtime_ming tests pyproject.toml /tmp/base/ && cp gpu_base_tmp/dit.py /tmp/base/realtime_ming/model/dit.py && cp gpu_base_tmp/dit_attention.py /tmp/base/realtime_ming/model/kernels/dit_attention.py
for v in new base new base; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d python3 bench/gpu_bench.py --out $OUT/$v-$RANDOM --stages talker --reps 20 --talker-buckets ${BUCKETS:-4,6,8,12,16} 2>&1 | grep "talker B=" | sed "s/^/$v /")
done
for v in new base; do
  d=$PWD; [ $v = base ] && d=/tmp/base
  (cd $d && PYTHONPATH=/tmp/site:$d python3 bench/gpu_bench.py --out $OUT/prof-$v --stages talker,talker_profile --reps 20 --talker-buckets 6 2>&1 | grep "talker profile" | sed "s/^/$v /")
  python3 -c "
import json,sys; d=json.load(open('$OUT/prof-$v/gpu_bench.json'))
p=d['stages']['talker_profile'] if 'stages' in d else d['talker_profile']
r=p['tail_step/B6/graphed']
print('$v tail B=6', r['step_ms'], r['kernels_per_step'], r['gpu_busy_ms_per_step'])
[print('   ', x) for x in r['top'][:8]]" 2>&1 | tail -10
done
STEPS=tests TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-430} bash bench/gpu_tp2.sh $OUT/gt 2>&1 | tail -6
grep -E "^(FAILED|ERROR)" $OUT/gt/tests.log | head

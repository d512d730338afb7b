#!/bin/bash
# 4x H200: issue 8's TP=4 run at the full shapes (dummy weights): e2e TTFA sweep through the served x4 config,
# the thinker decode at TP=4 over NCCL, engine throughput (thinker tok/s, spoken turns/s) at N=1 and 16
source bench/gpu_setup.sh >/dev/null 2>&1 || echo "gpu_setup failed"
nvidia-smi -L; echo "tree: $(cat gpu_base_tmp/TREE)"
C=configs/ming-flash-omni-2.0-x4.yaml
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
TURNS=2 timeout 270 bash bench/gpu_e2e.sh $OUT/e2e 1,2,4,8,16 $C > $OUT/e2e.log 2>&1; echo "e2e rc=$? $(( $(date +%s)-t0 ))s"
if [ -f $OUT/e2e/bench/summary.md ]; then grep -E "^\| A \|" $OUT/e2e/bench/summary.md | head -12; else tail -30 $OUT/e2e.log; fi
grep -iE "error|Traceback" $OUT/e2e/server.log | head -5
pkill -f "realtime_ming" ; pkill -f "bench --url"; sleep 5; nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr "\n" " "; echo
t1=$(date +%s)
timeout 130 python3 bench/tp_bench.py --tp 4 --all-reduce nccl --out $OUT/tp4 --budget-s 60 --batches 1,16 > $OUT/tp4.log 2>&1
echo "tp_bench rc=$? $(( $(date +%s)-t1 ))s"; grep -E "^\| " $OUT/tp4/tp_bench.md 2>/dev/null | head -20 || tail -20 $OUT/tp4.log
t2=$(date +%s)
left=$(( 560 - (t2 - t0) )); [ $left -gt 200 ] && left=200
[ $left -gt 60 ] && timeout $left python3 -m bench.engine_bench --modes spoken,text --config $C --set engine.preset=ming-flash-omni-2.0 \
  --set engine.weights=dummy --max-tokens 48 --steps-per-word 2 --levels 1,16 --rounds 1 --waves 2 --out $OUT/engine > $OUT/engine.log 2>&1
echo "engine_bench rc=$? $(( $(date +%s)-t2 ))s"; grep -E "^\| (N|1|16) " $OUT/engine/engine_bench.md 2>/dev/null | head -12
cd $OUT && tar czf all.tgz e2e tp4 engine e2e.log tp4.log engine.log 2>/dev/null; ls -la $OUT/all.tgz; find $OUT -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +; true

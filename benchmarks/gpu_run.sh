#!/usr/bin/env bash
# One device call: the oracle's GPU checks, then its throughput from cold caches, then the GPU tests with
# the builds that run left in the cache. Logs under $OUT (or /tmp/ks-out). Usage: benchmarks/gpu_run.sh [STEP...]
# Steps: smoke, throughput, tests, peer, demo, profiling, tolerance (default: smoke throughput tests).
set -u
out=${OUT:-/tmp/ks-out}; mkdir -p "$out"
work=/tmp/ks-work; mkdir -p "$work"; export KERNELSEARCH_CACHE=$work/cache KERNELSEARCH_PCH=$work/cache/pch PYTHONUNBUFFERED=1
steps=${*:-smoke throughput tests}
for step in $steps; do
  echo "== $step $(date +%T)"
  case $step in
    smoke) python3 -m pytest -q -m gpu -x tests/test_oracle_gpu.py -k trusted_side 2>&1 | tee "$out/smoke.log" | tail -25 ;;
    throughput) python3 benchmarks/throughput.py --ours --work "$work" --out "$out/throughput.json" 2>&1 | tee "$out/throughput.log" | tail -70 ;;
    tests) python3 -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu_tests.log" | tail -30 ;;
    tolerance) python3 benchmarks/tolerance_table.py --out "$out/tolerance.json" 2>&1 | tee "$out/tolerance.log" | tail -25 ;;
    peer) python3 benchmarks/throughput.py --peer "${PEER_N:-32}" --work /tmp/ks-peer --out "$out/peer.json" 2>&1 | tee "$out/peer.log" | tail -8 ;;
    demo) rm -rf /tmp/ks-demo-cache; ( export KERNELSEARCH_CACHE=/tmp/ks-demo-cache KERNELSEARCH_PCH=/tmp/ks-demo-cache/pch;
          /usr/bin/time -f "demo wall %e s" python3 -m search.cli demo --device cuda 2>&1 | tee "$out/demo.log" | tail -40 ) ;;
    profiling) python3 -c "import json, pathlib; c = pathlib.Path('benchmarks/candidates');
print(''.join(json.dumps({'task': t, 'completion': (c / t / 'correct.py').read_text()}) + chr(10)
               for t in ('level1/19_ReLU', 'level2/12_Gemm_Multiply_LeakyReLU')), end='')" > $work/profiling.jsonl
          python3 -m search.cli run --source .shared/kernelbench/kernelbench_levels1-3.jsonl --tasks level1/19_ReLU,level2/12_Gemm_Multiply_LeakyReLU \
          --generator "replay:$work/profiling.jsonl" --strategy profiling -n 1 --device cuda --out /tmp/ks-prof 2>&1 | tee "$out/profiling.log" | tail -15 ;;
  esac
done
echo "== done $(date +%T)"

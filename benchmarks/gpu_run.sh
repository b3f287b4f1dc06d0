#!/usr/bin/env bash
# One device call: several benchmark steps, each within its own time budget. Logs under $OUT (or
# /tmp/ks-out), each written whole as it goes, so that a step cut short keeps what it printed.
# Usage: benchmarks/gpu_run.sh STEP[:SECONDS]...   e.g. benchmarks/gpu_run.sh tolerance:200 throughput:250
#        benchmarks/gpu_run.sh --tree   (only the code tree's hash, to match a device call's first line)
# TESTS: the tests step's paths or node ids (default: tests). Steps: smoke, throughput, tests, peer, demo, profiling, fidelity, header, profiler, pstart, preload, race, tolerance (default: smoke throughput tests).
# A step past its seconds is stopped with everything it started (its own process group): nothing of it
# runs on beside the next step.
set -u
out=${OUT:-/tmp/ks-out}; mkdir -p "$out"
work=/tmp/ks-work; mkdir -p "$work"; export KERNELSEARCH_CACHE=$work/cache KERNELSEARCH_PCH=$work/cache/pch PYTHONUNBUFFERED=1
export out work
data=.shared/kernelbench/kernelbench_levels1-3.jsonl

step_command() {
  case $1 in
    smoke) echo "python3 -m pytest -q -m gpu -x tests/test_oracle_gpu.py -k trusted_side > $out/smoke.log 2>&1" ;;
    # the run folder under \$OUT: a run cut short still brings its samples back
    throughput) echo "python3 benchmarks/throughput.py --ours --work $work --run-dir $work/throughput-run --out $out/throughput.json > $out/throughput.log 2>&1" ;;
    # caches of their own: a throughput step after them stays cold, and their baselines are not another step's
    tests) echo "KERNELSEARCH_CACHE=$work/tests-cache KERNELSEARCH_PCH=$work/tests-cache/pch \
          python3 -m pytest -q -rfE -m gpu ${TESTS:-tests} > $out/tests.log 2>&1" ;;
    peer) echo "python3 benchmarks/throughput.py --peer ${PEER_N:-32} --work /tmp/ks-peer --out $out/peer.json > $out/peer.log 2>&1" ;;
    demo) echo "rm -rf /tmp/ks-demo-cache; KERNELSEARCH_CACHE=/tmp/ks-demo-cache KERNELSEARCH_PCH=/tmp/ks-demo-cache/pch \
          /usr/bin/time -f 'demo wall %e s' python3 -m search.cli demo --device cuda --out $work/demo-run > $out/demo.log 2>&1" ;;
    profiling) echo "python3 -c \"import json, pathlib; c = pathlib.Path('benchmarks/candidates');
print(''.join(json.dumps({'task': t, 'completion': (c / t / 'correct.py').read_text()}) + chr(10)
               for t in ('level1/19_ReLU', 'level2/12_Gemm_Multiply_LeakyReLU')), end='')\" > $work/profiling.jsonl &&
          python3 -m search.cli run --source $data --tasks level1/19_ReLU,level2/12_Gemm_Multiply_LeakyReLU \
          --generator replay:$work/profiling.jsonl --strategy profiling -n 1 --device cuda --out $out/profiling-run > $out/profiling.log 2>&1" ;;
    fidelity) echo "KERNELSEARCH_PCH=$work/fidelity-cache/pch python3 benchmarks/fidelity.py ${FIDELITY_ARGS:-} --cache $work/fidelity-cache --out $out/fidelity.json > $out/fidelity.log 2>&1" ;;
    header) echo "python3 benchmarks/header_priority.py --cuda --busy ${HEADER_BUSY:-30} --repeats 1 --out $out/header.json > $out/header.log 2>&1" ;;
    pstart) echo "python3 benchmarks/profiler_start.py --repeats 3 --out $out/pstart0.json > $out/pstart.log 2>&1;
          python3 benchmarks/profiler_start.py --repeats 3 --busy 14 --out $out/pstart14.json >> $out/pstart.log 2>&1" ;;
    profiler) echo "python3 benchmarks/profiler_head.py --rounds ${PROFILER_ROUNDS:-4} --idle ${PROFILER_IDLE:-15} --out $out/profiler.json > $out/profiler.log 2>&1" ;;
    preload) echo "python3 benchmarks/fork_preload.py --workers ${PRELOAD_N:-12} --out $out/preload.json > $out/preload.log 2>&1" ;;
    race) echo "python3 benchmarks/profiler_race.py --processes ${RACE_N:-16} --out $out/race.json > $out/race.log 2>&1" ;;
    tolerance) echo "KERNELSEARCH_PCH=$work/tolerance-cache/pch python3 benchmarks/tolerance_table.py --source $data --cache $work/tolerance-cache --out $out/tolerance.json > $out/tolerance.log 2>&1" ;;
    *) return 1 ;;
  esac
}

# A step cut short: what every process was doing (state, wait channel) and, through `kill -USR1`, the Python
# stacks of the oracle actor and its workers (faulthandler), in one file.
diagnose() {
  local file=$out/$1.stuck.txt
  { date +%T; ps -eo pid,ppid,pgid,stat,etimes,pcpu,rss,wchan:28,args --sort=pid | cut -c1-260; } > "$file" 2>&1
  for pid in $(pgrep -f 'OracleActor|forkserver|multiprocessing'); do kill -USR1 "$pid" 2>/dev/null; done
  sleep 3
  for f in /tmp/ray/session_latest/logs/worker-*.err /tmp/ks-worker-*/stderr.txt; do
    grep -q 'Thread 0x\|Current thread' "$f" 2>/dev/null && { echo "==== $f"; tail -n 400 "$f"; }
  done >> "$file" 2>&1
}

# The cores in use every 2 s while a step runs (`$out/STEP.cpu`: seconds from its start, cores busy): whether
# the host or the device bounded it.
cpu_sampler() {
  local n start prev cur busy total
  n=$(nproc); start=$(date +%s); read -ra prev < <(head -1 /proc/stat)
  while sleep 2; do
    read -ra cur < <(head -1 /proc/stat)
    busy=0; total=0
    for i in 1 2 3 4 5 6 7 8; do
      d=$(( cur[i] - prev[i] )); total=$(( total + d ))
      [ "$i" -ne 4 ] && [ "$i" -ne 5 ] && busy=$(( busy + d ))
    done
    c=$(( 100 * n * busy / (total > 0 ? total : 1) ))
    printf '%d %d.%02d\n' $(( $(date +%s) - start )) $(( c / 100 )) $(( c % 100 ))
    prev=("${cur[@]}")
  done
}

# Run folders travel as one archive each (few files come back from a device call).
pack() {
  for d in "$work"/*-run; do
    [ -d "$d" ] || continue; n=$(basename "$d")
    (cd "$work" && tar -czf "$out/$n.tgz" "$n" $(ls -d "$n.started" 2>/dev/null))
  done
  # the baselines' disk cache: each torch.compile baseline's phases (`compile_phases`)
  (cd "$work" && find . -type d -name baselines | tar -czf "$out/baselines.tgz" -T - 2>/dev/null)
}

# Which code this is: the device's copy of .git can lag behind its working tree, so its `git log` may name an
# older commit. Compare with `benchmarks/gpu_run.sh --tree` here.
tree() { find oracle search strategies tasks benchmarks tests -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12; }
[ "${1:-}" = "--tree" ] && { tree; exit 0; }
echo "== code tree $(tree)"

for item in ${*:-smoke throughput tests}; do
  step=${item%%:*}; seconds=${item#*:}; [ "$seconds" = "$item" ] && seconds=540
  command=$(step_command "$step") || { echo "unknown step: $step"; continue; }
  echo "== $step (at most $seconds s) $(date +%T)"
  setsid bash -c "$command" &
  leader=$!
  cpu_sampler > "$out/$step.cpu" 2>/dev/null &
  sampler=$!
  ( sleep "$seconds"; diagnose "$step"; kill -TERM -- "-$leader" 2>/dev/null; sleep 5; kill -KILL -- "-$leader" 2>/dev/null ) &
  watchdog=$!
  wait "$leader"; echo "   exit $?"
  kill "$watchdog" "$sampler" 2>/dev/null; wait "$watchdog" "$sampler" 2>/dev/null
  kill -KILL -- "-$leader" 2>/dev/null  # whatever the step left behind
  tail -n "${TAIL:-25}" "$out/$step.log" 2>/dev/null || ls "$out"
done
pack
echo "== done $(date +%T)"

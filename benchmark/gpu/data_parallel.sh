#!/usr/bin/env bash
# Engine layouts side by side, in one device call (issue 25: `--gpus 0` is today's server;
# issue 26: `--gpus 0,1` against `--gpus 0`): the same load (benchmark/gpu/h200_serving.sh with
# SUMMARY_ONLY=1) against servers started one after the other on this machine, each differing
# only in its engine flags, then benchmark.compare's table of them (OUT/compare.txt).
#
#   bash benchmark/gpu/data_parallel.sh OUT_DIR PLAN [LEVELS] [MAX_TOKENS]
#
# PLAN, the cases in order (ORDER=reverse runs them last to first: the second call of a pair,
# so that neither layout always runs on the warmer machine):
#   one-gpu     default (no engine flag), gpus0 (--gpus 0)                          1 GPU
#   shared-gpu  gpus0 (--gpus 0), gpus0x2 (--gpus 0 --engines 2: two engines on GPU 0,
#               each with half of --gpu-memory-utilization)                         1 GPU
#   two-gpu     gpus0 (--gpus 0), gpus01 (--gpus 0,1: an engine on each)            2 GPUs
#   codec-gpu   default (no flag: LM and codec on GPU 0), codec1 (--codec-device cuda:1:
#               the codec on the second GPU; Orpheus)                               2 GPUs
#   custom      CASES="name:serve flags;name:serve flags;..." (names: letters, digits, _ -)
# LEVELS default: 1,128,256 (one-gpu, shared-gpu), 256,448,640 (two-gpu): concurrent streams.
# Whatever h200_serving.sh reads passes through to every case (MODEL, SERVE_ARGS, DURATION_S,
# RAMP_S, LEVELS2, MAX_NUM_SEQS, COMMIT, DMON, ...); SINGLE_N defaults to 20 here. The wheels are
# installed once, by the first case.
# Files back: OUT/compare.txt, OUT/<case>/summary.txt, OUT/bench_json.tgz (every case's
# bench*.json.gz): two more than the cases, within the device's eight.
# Time: each case starts its server (the model's load and graph capture) and runs every level
# (warm-up, DURATION_S, the ramp); two cases of three levels were planned to fit one 10-minute
# call, not timed yet.
set -uo pipefail
out=${1:?usage: benchmark/gpu/data_parallel.sh OUT_DIR PLAN [LEVELS] [MAX_TOKENS]}
plan=${2:?PLAN: one-gpu, shared-gpu, two-gpu, codec-gpu or custom}
case "$plan" in
  one-gpu)    cases="default:;gpus0:--gpus 0"; levels=${3:-1,128,256} ;;
  shared-gpu) cases="gpus0:--gpus 0;gpus0x2:--gpus 0 --engines 2"; levels=${3:-1,128,256} ;;
  two-gpu)    cases="gpus0:--gpus 0;gpus01:--gpus 0,1"; levels=${3:-256,448,640} ;;
  codec-gpu)  cases="default:;codec1:--codec-device cuda:1"; levels=${3:-1,256,448} ;;
  custom)     cases=${CASES:?custom needs CASES="name:flags;name:flags"}; levels=${3:-1,128,256} ;;
  *) echo "PLAN must be one-gpu, shared-gpu, two-gpu, codec-gpu or custom, got $plan"; exit 2 ;;
esac
max_tokens=${4:-}
serving=${SERVING_SCRIPT:-benchmark/gpu/h200_serving.sh}  # tests put a stand-in here
IFS=';' read -r -a entries <<< "$cases"
if [ "${ORDER:-forward}" = reverse ]; then
  reversed=(); for ((i=${#entries[@]}-1; i>=0; i--)); do reversed+=("${entries[i]}"); done
  entries=("${reversed[@]}")
fi
mkdir -p "$out"
export SUMMARY_ONLY=1 SINGLE_N=${SINGLE_N:-20}
base_args=${SERVE_ARGS:-}
named=()
first=1
for entry in "${entries[@]}"; do
  name=${entry%%:*}
  flags=${entry#*:}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "bad case name: $name"; exit 2; }
  echo "===== case $name: voxgate serve ... $flags $base_args"
  # the previous case's engines must have let go of the GPUs before this one sizes its cache
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break
    sleep 1
  done
  SKIP_WHEELS=$((1 - first)) SERVE_ARGS="$flags $base_args" \
    bash "$serving" "$out/$name" "$levels" ${max_tokens:+"$max_tokens"}
  first=0
  for f in "$out/$name"/bench*.json.gz; do [ -f "$f" ] && named+=("$name=$f"); done
done
export PYTHONPATH=$PWD:/tmp/site
# compare the first sweep (bench.json.gz) of each case
runs=(); for n in "${named[@]}"; do [[ "$n" == */bench.json.gz ]] && runs+=("$n"); done
if [ ${#runs[@]} -gt 0 ]; then
  { echo "plan $plan, levels $levels, order ${ORDER:-forward}, model ${MODEL:-orpheus}"
    nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader 2>/dev/null
    python3 -m benchmark.compare "${runs[@]}"; } 2>&1 | tee "$out/compare.txt"
fi
(cd "$out" && ls */bench*.json.gz >/dev/null 2>&1 && tar -czf bench_json.tgz */bench*.json.gz \
  && rm -f */bench*.json.gz)
ls -R "$out"

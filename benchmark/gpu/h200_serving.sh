#!/usr/bin/env bash
# Serving figures on the GPU machine, in one device call (issue 5): optionally the codec
# benchmark and the engine step profile (PROFILE_BATCHES), then MODEL (default orpheus: Orpheus-3B;
# qwen3-tts: Qwen3-TTS 1.7B; random weights) served by `voxgate serve`: single-stream time to first audio over SINGLE_N short requests,
# `voxgate bench` at LEVELS concurrent streams (first starts spread over RAMP_S), GPU
# utilisation from nvidia-smi, the server's figures second by second beside the clients'
# underruns (timeline_bench.txt, benchmark.timeline); then, if OVERHEAD_LEVELS is set, the gateway's added latency
# with the synthetic engine.
#
#   bash benchmark/gpu/h200_serving.sh OUT_DIR [LEVELS] [MAX_TOKENS]
#
# LEVELS 0: no sweep (the single-stream figures alone).
# LEVELS2: a second sweep on the same server, first starts spread over RAMP2_S (default 10 s).
# SUMMARY_ONLY=1: the text outputs in one summary.txt (the JSON files stay), so two runs of
# this script (an A/B, into OUT/a and OUT/b) fit the device's eight returned files.
# MAX_NUM_SEQS: the engine's jobs at once (default 1024: a stream holds two, its spoken segment
# and the one generated ahead). SERVE_ARGS: more `voxgate serve` options (scheduling settings to compare). SINGLE_N=0 skips
# the single-stream requests (SINGLE_MAX_TOKENS tokens each, default 84; SINGLE_TOKEN_RATE: the
# same again with the text streamed word by word at that many words/s; several, comma-separated:
# one run each, single_words_RATE.json). STACKS_EVERY_S: with py-spy among the wheels, dump the server's
# and the engine's Python stacks that often into stacks.txt (what a slow engine is doing).
# PROFILE_KERNELS: with PROFILE_BATCHES, the kernel table of the steps at that batch size too.
# SKIP_WHEELS=1: the wheels are in /tmp/site already (a second run in one call: data_parallel.sh).
# COMMIT: the commit the JSON files name (VOXGATE_COMMIT), where the machine's copy of the tree
# carries another .git (the GPU machine's does: give COMMIT=$(git rev-parse HEAD) from here).
# Needs the wheels in .whl/ (../shared/device/fetch-wheels.sh) and, to skip FlashInfer's JIT
# compile, its kernel cache in .fi_cache/fi_cache.tgz (optional); .fi_cache/inductor.tgz likewise
# holds torch.compile's cache (a stale one costs a recompile: 18 s for the first decode graph).
# BENCH_ARGS: more `voxgate bench` options for the sweeps (e.g. "--overload 1.5,2": levels at
# those multiples of the one level given, beyond capacity).
# DMON: when nvidia-smi samples GPU utilisation (once a second): all (default), bench2 (only
# during the second sweep) or off.
# PYSPY_RECORD_S: with py-spy among the wheels, record the server's and the engine's stacks
# 500 times a second for that long from the first sweep's start (OUT/pyspy.json.gz, speedscope).
# VOXGATE_TORCH_PROFILE_DIR (with _MIN_ROWS, _STEPS) passes through to the server: a torch.profiler
# window over its loaded steps (engine/torch_profile.py; run 27 used $OUT/a, 500 rows, 40 steps);
# it stops the server while it writes, so that level's figures are not a measurement.
# SAVE_CACHES=1: both caches, as this run left them, into OUT/fi_cache.tgz and OUT/inductor.tgz
# (two of the eight returned files), to copy into .fi_cache/ here for the next fresh machine.
set -uo pipefail
out=${1:?usage: benchmark/gpu/h200_serving.sh OUT_DIR [LEVELS] [MAX_TOKENS]}
levels=${2:-1,32,128,256}
max_tokens=${3:-287}  # 41 frames = 3.5 s per segment; a 30-50 word prompt is ~3 segments
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -n "${COMMIT:-}" ] && export VOXGATE_COMMIT=$COMMIT
[ "${SKIP_WHEELS:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
# what the GPU machine lacks and the server imports at start: say so now, not in serve.log
python3 -c "import flashinfer, soxr, websockets" 2>/dev/null \
  || { echo "missing wheels: run ../shared/device/fetch-wheels.sh soxr here and carry .whl"; exit 1; }
if [ -f .fi_cache/fi_cache.tgz ]; then tar -xzf .fi_cache/fi_cache.tgz -C ~; fi
if [ -f .fi_cache/inductor.tgz ]; then tar -xzf .fi_cache/inductor.tgz -C /tmp; fi
# which GPU this was (runs on two loans of "the same" machine differed by 6% per step: runs 24-26)
nvidia-smi --query-gpu=name,memory.total,driver_version,uuid,serial,pci.bus_id,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu \
  --format=csv | tee "$out/gpu.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$out/gpu.txt"

if [ -n "${PROFILE_BATCHES:-}" ]; then
  echo "== codec: window re-decode vs stateful step (64 rows)"
  for dt in float32 bfloat16; do
    timeout 60 python3 -m benchmark.gpu.codec_stream --device cuda --graphs --batch 64 --runs 30 --dtype $dt 2>&1 \
      | grep -v Warn | tail -3 | tee -a "$out/codec.txt"
  done
  echo "== engine step profile"
  timeout 400 python3 -m benchmark.gpu.engine_profile --model "${MODEL:-orpheus}" --batch "$PROFILE_BATCHES" --steps 40 \
    ${PROFILE_KERNELS:+--kernels $PROFILE_KERNELS} --json "$out/profile.json" \
    > "$out/profile.log" 2>&1
  sed -n "/engine step on/,\$p" "$out/profile.log" | grep -v Warn | tee "$out/profile.txt"
fi

echo "== ${MODEL:-orpheus} serve"
python3 -m gateway.cli serve --model "${MODEL:-orpheus}" --load-format dummy --device cuda \
  --max-num-seqs "${MAX_NUM_SEQS:-1024}" --port 8765 --log-level WARNING ${SERVE_ARGS:-} > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT  # a failed step must not leave the port taken for the next run
for _ in $(seq 300); do
  grep -q "serving on" "$out/serve.log" && break
  kill -0 $server 2>/dev/null || { tail -30 "$out/serve.log"; exit 1; }
  sleep 1
done
grep "serving on" "$out/serve.log" || { tail -30 "$out/serve.log"; kill $server; exit 1; }
dmon=
start_dmon() {  # GPU utilisation, sampled by nvidia-smi once a second, from now on
  [ -z "$dmon" ] && { nvidia-smi dmon -s um -d 1 >> "$out/dmon.txt" 2>&1 & dmon=$!; }
}
stop_dmon() { [ -n "$dmon" ] && kill $dmon 2>/dev/null; dmon=; }
case "${DMON:-all}" in all) start_dmon ;; off|bench2) ;; *) echo "DMON must be all, bench2 or off"; exit 1 ;; esac
stacks=
if [ -n "${STACKS_EVERY_S:-}" ] && [ -x /tmp/site/bin/py-spy ]; then
  # every STACKS_EVERY_S seconds, every Python thread's stack of the server and its engine
  (while kill -0 $server 2>/dev/null; do
     echo "--- $(date +%T)"; /tmp/site/bin/py-spy dump --pid $server --subprocesses 2>&1
     sleep "$STACKS_EVERY_S"
   done) > "$out/stacks.txt" 2>&1 &
  stacks=$!
fi
if [ "${SINGLE_N:-50}" -gt 0 ]; then
  echo "== single stream, ${SINGLE_N:-50} short requests"
  python3 -m gateway.cli bench --url ws://127.0.0.1:8765/v1/stream -c 1 -n "${SINGLE_N:-50}" --warmup 2 \
    --option max_tokens="${SINGLE_MAX_TOKENS:-84}" --min-words 5 --max-words 12 --no-progress \
    --json "$out/single.json" 2>&1 | tail -8 | tee "$out/single.txt"
  for rate in ${SINGLE_TOKEN_RATE:+${SINGLE_TOKEN_RATE//,/ }}; do  # the same, text streamed word by word at that many words/s
    name=single_words; [[ "${SINGLE_TOKEN_RATE:-}" == *,* ]] && name=single_words_$rate
    echo "== single stream, text at $rate words/s" | tee -a "$out/single.txt"
    python3 -m gateway.cli bench --url ws://127.0.0.1:8765/v1/stream -c 1 -n "${SINGLE_N:-50}" --warmup 2 \
      --option max_tokens="${SINGLE_MAX_TOKENS:-84}" --min-words 5 --max-words 12 --no-progress \
      --token-rate "$rate" --json "$out/$name.json" 2>&1 | tail -8 | tee -a "$out/single.txt"
  done
fi
sweep() {  # NAME LEVELS RAMP_S: one voxgate bench sweep into NAME.json.gz, NAME.txt, timeline of NAME
  echo "== levels $2, first starts spread over $3 s"
  python3 -m gateway.cli bench --url ws://127.0.0.1:8765/v1/stream -c "$2" --warmup 2 --duration ${DURATION_S:-15} \
    --ramp "$3" --option max_tokens="$max_tokens" --min-words 30 --max-words 50 --no-progress \
    ${BENCH_ARGS:-} --json "$out/$1.json" 2>&1 | tail -30 | tee "$out/$1.txt"
  python3 -m benchmark.timeline "$out/$1.json" > "$out/timeline_$1.txt" 2>&1  # second by second
  gzip -f "$out/$1.json"  # every stream's chunk times: too big to bring back uncompressed
}
recorder=
if [ -n "${PYSPY_RECORD_S:-}" ] && [ -x /tmp/site/bin/py-spy ]; then
  # sample the server and its engine 500 times a second, in order (speedscope), without pausing them
  /tmp/site/bin/py-spy record --pid $server --subprocesses --idle --nonblocking --rate 500 \
    --duration "$PYSPY_RECORD_S" --format speedscope -o "$out/pyspy.json" > "$out/pyspy.log" 2>&1 &
  recorder=$!
fi
[ "$levels" = 0 ] || sweep bench "$levels" "${RAMP_S:-3}"  # LEVELS 0: the single-stream figures only
[ "${DMON:-all}" = bench2 ] && start_dmon
[ -n "${LEVELS2:-}" ] && sweep bench2 "$LEVELS2" "${RAMP2_S:-10}"
stop_dmon
[ -n "$recorder" ] && { wait $recorder; gzip -f "$out/pyspy.json"; tail -3 "$out/pyspy.log"; }
kill $server $stacks 2>/dev/null
wait $server 2>/dev/null
[ -f "$out/dmon.txt" ] && awk '!/^#/ {s+=$2; n++} END {if (n) printf "GPU utilisation (sm %%), mean over the run: %.0f\n", s/n}' \
  "$out/dmon.txt" | tee -a "$out/bench.txt"
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then  # one text file (and the JSON) per run: room for an A/B in one call
  for f in gpu.txt single.txt bench.txt timeline_bench.txt bench2.txt timeline_bench2.txt; do
    [ -f "$out/$f" ] && { echo "===== $f"; cat "$out/$f"; }
  done > "$out/summary.txt"
  { echo "===== serve.log (errors and last lines)"; grep -iE "error|traceback" "$out/serve.log" | head -20
    tail -5 "$out/serve.log"; } >> "$out/summary.txt"
  rm -f "$out"/gpu.txt "$out"/single.txt "$out"/single.json "$out"/bench.txt "$out"/bench2.txt \
    "$out"/timeline_bench*.txt "$out"/dmon.txt "$out"/serve.log
fi

if [ "${SAVE_CACHES:-0}" = 1 ]; then
  tar -czf "$out/fi_cache.tgz" -C ~ .cache/flashinfer 2>/dev/null
  tar -czf "$out/inductor.tgz" -C /tmp "torchinductor_$(id -un)" 2>/dev/null
  ls -la "$out"/fi_cache.tgz "$out"/inductor.tgz
fi

[ -n "${OVERHEAD_LEVELS:-}" ] || exit 0
echo "== gateway overhead (synthetic engine, CPU only)"
timeout 150 python3 -m benchmark.gateway_overhead --streams "$OVERHEAD_LEVELS" --ramp-s 3 \
  --settle-s 2 --measure-s 6 --json "$out/overhead.json" 2>&1 | tail -6 | tee "$out/overhead.txt"


#!/usr/bin/env bash
# Serving settings against the defaults on one GPU in one device call: `h200_serving.sh` once per
# VARIANTS entry (a fresh server each, the same LEVELS and MAX_TOKENS), into OUT_DIR/NAME with
# SUMMARY_ONLY=1, so the levels compare on one machine (docs/scheduling.md, "Orpheus near its
# capacity", says which settings the model favours). About 2-3 minutes a variant with the caches in
# .fi_cache/ at two 15 s levels: run it through detach.sh.
#
#   bash benchmark/gpu/serve_ab.sh OUT_DIR [LEVELS] [MAX_TOKENS]
#
# VARIANTS: NAME=SERVE_ARGS entries separated by ";" (default: Orpheus's defaults; the same
# without its Triton kernels; Orpheus's defaults before session 48: a constant cap of 384, prefill
# batches of 8 after 50 ms, the runner's prefill token counts, no Triton kernels).
# The environment h200_serving.sh reads passes through (RAMP_S, DURATION_S, MODEL, COMMIT, ...);
# SINGLE_N defaults to 0 here, and the wheels are installed once.
set -uo pipefail
out=${1:?usage: benchmark/gpu/serve_ab.sh OUT_DIR [LEVELS] [MAX_TOKENS]}
levels=${2:-480,512}
max_tokens=${3:-170}
variants=${VARIANTS:-"default=;no_kernels=--decode-attention cuda-cores --kv-write index --model-setting orpheus_norm=compiled --model-setting orpheus_silu_mul=compiled;before=--max-num-decode-seqs 384 --decode-cap-budget 0 --prefill-batch-seqs 8 --prefill-wait-s 0.05 --prefill-token-buckets 32,64,128,256,512 --decode-attention cuda-cores --kv-write index --model-setting orpheus_norm=compiled --model-setting orpheus_silu_mul=compiled"}
mkdir -p "$out"
export SUMMARY_ONLY=1 SINGLE_N=${SINGLE_N:-0} RAMP_S=${RAMP_S:-10} DURATION_S=${DURATION_S:-15}
skip=${SKIP_WHEELS:-0}
IFS=';' read -ra entries <<< "$variants"
for entry in "${entries[@]}"; do
  name=${entry%%=*}
  echo "== $name: ${entry#*=}" | tee -a "$out/variants.txt"
  SERVE_ARGS="${entry#*=}" SKIP_WHEELS=$skip bash benchmark/gpu/h200_serving.sh "$out/$name" "$levels" "$max_tokens"
  skip=1
  grep -E "^ +[0-9]+ +[0-9]+ " "$out/$name/summary.txt" | sed "s/^/$name /" | tee -a "$out/variants.txt"
done

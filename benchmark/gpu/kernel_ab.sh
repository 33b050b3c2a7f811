#!/usr/bin/env bash
# The kernel candidates against the defaults on one GPU in one device call (an estimated 8-15
# minutes with the caches in .fi_cache/, more for fp8's first compiles: run it through detach.sh):
# `layer_kernels` (the rotation, SiLU-mul, the norms, fp8's quantisations and the KV write alone,
# and Orpheus's forward with each, bf16 and fp8 weights), `decode_attention` (FlashInfer's kernels
# and the runtime's Triton one alone), then `engine_profile` at BATCHES once per VARIANTS entry, all on
# the same machine, so the step times compare (docs/performance.md, "The engine alone").
#
#   bash benchmark/gpu/kernel_ab.sh OUT_DIR [BATCHES]
#
# VARIANTS: NAME=ENGINE_PROFILE_ARGS entries separated by ";" (default: the defaults, whose
# rotation, SiLU-mul, norms, KV write and decode attention are Triton kernels since session 48;
# then each of them in its earlier form (compiled, index_put, FlashInfer's CUDA-core decode), all
# of those together; then fp8 weights with the defaults and with the compiled norms and SiLU-mul). SKIP_WHEELS=1:
# the wheels are in /tmp/site already. Needs what h200_serving.sh needs (.whl/, optionally .fi_cache/).
set -uo pipefail
out=${1:?usage: benchmark/gpu/kernel_ab.sh OUT_DIR [BATCHES]}
batches=${2:-256,448}
variants=${VARIANTS:-"default=;silu_compiled=--setting orpheus_silu_mul=compiled;norm_compiled=--setting orpheus_norm=compiled;kv_index=--kv-write index;attn_cuda_cores=--decode-attention cuda-cores;rope_compiled=--setting orpheus_rope=compiled;before=--setting orpheus_silu_mul=compiled --setting orpheus_norm=compiled --kv-write index --decode-attention cuda-cores;fp8=--quantization fp8;fp8_compiled=--quantization fp8 --setting orpheus_norm=compiled --setting orpheus_silu_mul=compiled"}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ "${SKIP_WHEELS:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
if [ -f .fi_cache/fi_cache.tgz ]; then tar -xzf .fi_cache/fi_cache.tgz -C ~; fi
if [ -f .fi_cache/inductor.tgz ]; then tar -xzf .fi_cache/inductor.tgz -C /tmp; fi
nvidia-smi --query-gpu=name,uuid --format=csv | tee "$out/gpu.txt"

echo "== layer_kernels"
timeout 300 python3 -m benchmark.gpu.layer_kernels --rows 1,64,256,448 --fp8 --json "$out/layers.json" 2>&1 \
  | grep -v -i warn | tee "$out/layers.txt"
echo "== decode_attention"
timeout 240 python3 -m benchmark.gpu.decode_attention --batch 256,448 --context 128,256 --kv-dtype bf16 \
  --json "$out/attention.json" 2>&1 | grep -v -i warn | tee "$out/attention.txt"
IFS=';' read -ra entries <<< "$variants"
for entry in "${entries[@]}"; do
  name=${entry%%=*}
  args=${entry#*=}
  echo "== engine_profile $name: ${args:-(the defaults)}"
  # shellcheck disable=SC2086  # (the variant's arguments, split on purpose)
  timeout 300 python3 -m benchmark.gpu.engine_profile --batch "$batches" --steps 40 --max-tokens 170 $args \
    --json "$out/profile_$name.json" > "$out/profile_$name.log" 2>&1
  sed -n "/ batch /,\$p" "$out/profile_$name.log" | grep -v Warn | tee "$out/profile_$name.txt"
done

#!/bin/sh
# Starts the patched llama-server on one task of a converted model directory, with the command
# line `vlembed serve` uses for the llama-servers it starts itself. Reads the same variables:
#
#   VLEMBED_MODEL         converted model directory (manifest.json, GGUFs)     default /models
#   VLEMBED_TASK          task whose text GGUF to serve                        default retrieval
#   VLEMBED_VARIANT       f32 | f16 | bf16 | Q8_0 | Q4_K_M | IQ4_XS            default f16
#   VLEMBED_FLASH_ATTN    auto | on | off (auto: off for f32, on otherwise)   default auto
#   VLEMBED_REPACK        auto | on | off (auto: off for K-quant / IQ variants) default auto
#   VLEMBED_VISION_BATCH_TOKENS  image tokens per shared vision forward; 1 = off  default 2048
#   VLEMBED_MMPROJ_DTYPE  dtype of mmproj-<dtype>.gguf; default: the only one in the directory
#   VLEMBED_PARALLEL      slots (-np)                                          default 2
#   VLEMBED_CTX_SIZE      context of one slot, in tokens                       default 4096
#   VLEMBED_THREADS       CPU threads (-t)                    default: llama-server's choice
#   VLEMBED_LLAMA_PORT    listening port                                       default 8080
#
# --image-max-tokens is the manifest's max_pixels / 28², as `vlembed serve` sets it.
# -c is CTX_SIZE x PARALLEL (one KV cache per slot, --no-kv-unified). llama-server embeds a
# prompt only when it fits in one micro-batch, so -b and -ub are CTX_SIZE. Arguments given to
# the container are appended (e.g. --no-mmproj-offload); llama-server's own LLAMA_ARG_*
# variables work too.
set -eu

die() {
    echo "vlembed-llama-server: $*" >&2
    exit 2
}

positive_int() {
    case $2 in
        '' | *[!0-9]* | 0*) die "$1 must be a positive integer, got '$2'" ;;
    esac
}

model_dir=${VLEMBED_MODEL:-/models}
task=${VLEMBED_TASK:-retrieval}
variant=${VLEMBED_VARIANT:-f16}
# flash attention: off for the f32 parity variant, on otherwise (as vlembed serve's auto)
flash=${VLEMBED_FLASH_ATTN:-auto}
if [ "$flash" = auto ]; then
    if [ "$variant" = f32 ]; then flash=off; else flash=on; fi
fi
# weight repacking: off for K-quant / IQ variants, whose tiled VNNI kernels skip repacked
# weights (as vlembed serve's auto)
case ${VLEMBED_REPACK:-auto} in
    auto) case $variant in Q[2-6]_K* | IQ4_XS | IQ[1-3]*) repack=off ;; *) repack=on ;; esac ;;
    on | off) repack=$VLEMBED_REPACK ;;
    *) die "VLEMBED_REPACK must be auto, on or off, got '$VLEMBED_REPACK'" ;;
esac
if [ "$repack" = off ]; then
    set -- --no-repack "$@"
fi
parallel=${VLEMBED_PARALLEL:-2}
ctx=${VLEMBED_CTX_SIZE:-4096}
threads=${VLEMBED_THREADS:-}
port=${VLEMBED_LLAMA_PORT:-8080}

vision_batch=${VLEMBED_VISION_BATCH_TOKENS:-2048}
positive_int VLEMBED_PARALLEL "$parallel"
positive_int VLEMBED_VISION_BATCH_TOKENS "$vision_batch"
positive_int VLEMBED_CTX_SIZE "$ctx"
positive_int VLEMBED_LLAMA_PORT "$port"
if [ -n "$threads" ]; then
    positive_int VLEMBED_THREADS "$threads"
    set -- -t "$threads" "$@"
fi

[ -f "$model_dir/manifest.json" ] \
    || die "$model_dir has no manifest.json: convert a checkpoint into it first (docker compose run --rm convert)"
text="$model_dir/text-$task-$variant.gguf"
if [ ! -f "$text" ]; then
    found=$(for f in "$model_dir"/*.gguf; do if [ -f "$f" ]; then printf ' %s' "${f##*/}"; fi; done)
    die "$text not found; GGUF files there:${found:- none}"
fi

# the largest image the model's preprocessing makes, in merged tokens (28 x 28 pixels each)
max_pixels=$(sed -n 's/.*"max_pixels"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' \
    "$model_dir/manifest.json" | head -n 1)
[ -n "$max_pixels" ] \
    || die "$model_dir/manifest.json has no max_pixels: convert the checkpoint again with this version"
image_max_tokens=$((max_pixels / 784))

if [ -n "${VLEMBED_MMPROJ_DTYPE:-}" ]; then
    mmproj="$model_dir/mmproj-$VLEMBED_MMPROJ_DTYPE.gguf"
    [ -f "$mmproj" ] || die "$mmproj not found"
else
    mmproj=
    for f in "$model_dir"/mmproj-*.gguf; do
        [ -f "$f" ] || continue
        [ -z "$mmproj" ] || die "several mmproj-*.gguf in $model_dir: set VLEMBED_MMPROJ_DTYPE"
        mmproj=$f
    done
    [ -n "$mmproj" ] || die "no mmproj-*.gguf in $model_dir"
fi

exec llama-server \
    -m "$text" \
    --mmproj "$mmproj" \
    --embeddings \
    --pooling none \
    --host 0.0.0.0 \
    --port "$port" \
    -np "$parallel" \
    -c "$((ctx * parallel))" \
    -b "$ctx" \
    -ub "$ctx" \
    --no-kv-unified \
    --no-webui \
    -fa "$flash" \
    --mmproj-flash-attn on \
    --mtmd-batch-max-tokens "$vision_batch" \
    --image-max-tokens "$image_max_tokens" \
    "$@"

#!/bin/sh
# Usage: build-llama-server DEST [vlembed build-server flags...]
#
# Builds the patched llama-server with `vlembed build-server` (pinned source, patch series,
# CMAKE_ARGS from the environment) and copies what a runtime image needs into DEST:
# llama-server, llama-quantize and the shared libraries built beside them (libllama, libggml*,
# libmtmd, and the ggml backends that GGML_BACKEND_DL loads from the binaries' directory).
set -eu

if [ $# -lt 1 ]; then
    echo "usage: build-llama-server DEST [vlembed build-server flags...]" >&2
    exit 2
fi
dest=$1
shift

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# `vlembed build-server` prints the llama-server path as its last line of standard output.
vlembed build-server "$@" >"$log"
cat "$log"
server=$(tail -n 1 "$log")
if [ ! -x "$server" ]; then
    echo "build-llama-server: the last line of 'vlembed build-server' is not an executable: '$server'" >&2
    exit 1
fi
bindir=$(dirname "$server")

mkdir -p "$dest"
for exe in llama-server llama-quantize; do
    if [ ! -x "$bindir/$exe" ]; then
        echo "build-llama-server: $exe missing from $bindir" >&2
        exit 1
    fi
    cp "$bindir/$exe" "$dest/"
done
find "$bindir" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$dest/" \;
echo "build-llama-server: copied to $dest:"
ls -l "$dest"

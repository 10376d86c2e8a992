#!/bin/sh
# Starts `vlembed serve` in a container. serve reads its VLEMBED_* variables itself; this script
# only does what compose cannot express:
#
# - an empty VLEMBED_* variable is removed, so that `VAR: ${VAR:-}` in compose.yaml means
#   "serve's own default" rather than an empty value;
# - VLEMBED_API_KEY is read from the file VLEMBED_API_KEY_FILE (a compose or Kubernetes
#   secret) when that file is not empty; the file wins over the variable;
# - when VLEMBED_BACKENDS is empty and BACKEND_SERVICE is set, it lists the llama-server
#   replicas of that compose service by container name, one URL each, so serve spreads requests
#   over them (least outstanding requests first):
#       [BACKEND_TASK=]http://BACKEND_PROJECT-BACKEND_SERVICE-i:BACKEND_PORT, i = 1..BACKEND_REPLICAS
#   (BACKEND_PROJECT default vlembed, BACKEND_REPLICAS 1, BACKEND_PORT 8080).
set -eu

die() {
    echo "vlembed-serve: $*" >&2
    exit 2
}

if [ -n "${VLEMBED_API_KEY_FILE:-}" ]; then
    [ -r "$VLEMBED_API_KEY_FILE" ] || die "VLEMBED_API_KEY_FILE $VLEMBED_API_KEY_FILE is not readable by uid $(id -u)"
    key=$(cat "$VLEMBED_API_KEY_FILE")
    if [ -n "$key" ]; then
        VLEMBED_API_KEY=$key
        export VLEMBED_API_KEY
    fi
    unset key
fi
unset VLEMBED_API_KEY_FILE

if [ -z "${VLEMBED_BACKENDS:-}" ] && [ -n "${BACKEND_SERVICE:-}" ]; then
    replicas=${BACKEND_REPLICAS:-1}
    case $replicas in
        '' | *[!0-9]* | 0*) die "BACKEND_REPLICAS must be a positive integer, got '$replicas'" ;;
    esac
    backends=
    i=1
    while [ "$i" -le "$replicas" ]; do
        url="http://${BACKEND_PROJECT:-vlembed}-$BACKEND_SERVICE-$i:${BACKEND_PORT:-8080}"
        backends="${backends:+$backends,}${BACKEND_TASK:+$BACKEND_TASK=}$url"
        i=$((i + 1))
    done
    VLEMBED_BACKENDS=$backends
    export VLEMBED_BACKENDS
fi
unset BACKEND_SERVICE BACKEND_REPLICAS BACKEND_PROJECT BACKEND_PORT BACKEND_TASK

for var in $(env | sed -n 's/^\(VLEMBED_[A-Z0-9_]*\)=$/\1/p'); do
    unset "$var"
done

exec vlembed serve "$@"

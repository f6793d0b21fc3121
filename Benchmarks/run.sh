#!/bin/sh
# Reruns every benchmark behind the README's figures: release build, then crashcap-bench.
#   Benchmarks/run.sh [crash] [--runs N]
set -eu
cd "$(dirname "$0")/.."
Scripts/install-dependencies.sh
# The ingest benchmark's load generator.
if ! command -v wrk >/dev/null; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi
swift build -c release
exec .build/release/crashcap-bench "$@"

#!/bin/sh
# Reruns every benchmark behind the README's figures: release build, then crashcap-bench.
#   Benchmarks/run.sh [crash] [--runs N]
set -eu
cd "$(dirname "$0")/.."
Scripts/install-dependencies.sh
swift build -c release
exec .build/release/crashcap-bench "$@"

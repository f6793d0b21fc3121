#!/bin/sh
# Every test: builds everything (the samples, the CLI, the C-only preload library) and runs
# the whole suite, crash tests included.
set -eu
cd "$(dirname "$0")/.."
Scripts/install-dependencies.sh
swift build
Scripts/build-preload.sh
swift test "$@"

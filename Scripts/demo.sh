#!/bin/sh
# The main job, end to end: build, crash a sample under capture, then read the report.
set -eu
cd "$(dirname "$0")/.."
Scripts/install-dependencies.sh
swift build
Scripts/build-preload.sh >/dev/null
bin=.build/debug
work=$(mktemp -d /tmp/crashcapture-demo.XXXXXX)
echo "== crashing crash-sample-swift (force-unwrap of nil on a Dispatch queue) under capture"
set +e
CRASHCAPTURE_DIR="$work/crashes" SWIFT_BACKTRACE=enable=no "$bin/crash-sample-swift" swift-force-unwrap --context dispatch
status=$?
set -e
echo "== the process died as it would have without us: exit status $status (128 + SIGILL = 132)"
echo "== crashcap show $work/crashes"
"$bin/crashcap" show "$work/crashes" --frames 12

#!/bin/sh
# The main job, end to end: build, crash a sample under capture, read the report, replay it
# into the event store and upload it to a local collector, then list what the collector got.
set -eu
cd "$(dirname "$0")/.."
# Everything the demo puts in the temp directory, the toolchain's own folders included, goes
# into one folder, removed when it ends.
work=$(mktemp -d "${TMPDIR:-/tmp}/crashcapture-demo.XXXXXX")
collector=
trap '[ -n "$collector" ] && kill $collector 2>/dev/null; rm -rf "$work"' EXIT
export TMPDIR="$work"
# The same build settings as the test command's (Package.swift), so neither rebuilds after the other.
export CRASHCAPTURE_WARNINGS_AS_ERRORS=1
Scripts/install-dependencies.sh
swift build
Scripts/build-preload.sh >/dev/null
bin=.build/debug

"$bin/crashcap" collect --port 0 --db "$work/collector.sqlite" >"$work/collector.log" 2>&1 &
collector=$!
for _ in $(seq 1 100); do grep -q "listening on" "$work/collector.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$work/collector.log")
echo "== local collector at $url"

echo "== crash-sample-swift: tracks 3 events, then dereferences a bad pointer, under capture"
set +e
CRASHCAPTURE_DIR="$work/crashes" CRASH_SAMPLE_EVENTS=3 SWIFT_BACKTRACE=enable=no \
    "$bin/crash-sample-swift" pipeline-crash >/dev/null 2>&1
status=$?
set -e
echo "== it died as it would have without us: exit status $status (128 + SIGSEGV = 139)"

echo "== crashcap show $work/crashes"
"$bin/crashcap" show "$work/crashes" --frames 10

echo "== crashcap replay $work/crashes --upload $url"
"$bin/crashcap" replay "$work/crashes" --upload "$url"

echo "== what the collector holds (GET /events)"
python3 - "$url" <<'PY'
import json, sys, urllib.request
base = sys.argv[1][:-3]
for line in urllib.request.urlopen(base + "/events").read().decode().splitlines():
    event = json.loads(line)
    properties = event["properties"]
    detail = ""
    if event["event"] == "$AppCrashed":
        frames = event["crash"]["frames"]
        named = next((f["function"] for f in frames if "function" in f and "crash" in f["function"].lower()), "?")
        detail = f'{properties["crash_signal_name"]} in {named}'
    elif event["event"] == "$AppEnd":
        detail = f'$event_duration {properties["$event_duration"]} s, reason {properties["$app_end_reason"]}'
    elif "index" in properties:
        detail = f'index {properties["index"]}'
    print(f'  {event["event"]:<13} session {event["session_id"][:8]}  {detail}')
PY

#!/bin/sh
# The main job, end to end: build, crash a sample under capture, read the report, replay it
# into the event store and upload it to a local collector, then list what the collector got.
# What it makes is kept in .build/demo: the crash directory it names (crashes/, with the store
# the crash was imported into), the collector's database and log, and the build's output.
set -eu
cd "$(dirname "$0")/.."
demo="$(pwd)/.build/demo"
# A new run starts from an empty crash directory; the last run's is kept until then.
rm -rf "$demo"
mkdir -p "$demo"
# The toolchain's own temporary folders go into one folder, removed when the demo ends.
work=$(mktemp -d "${TMPDIR:-/tmp}/crashcapture-demo.XXXXXX")
collector=
trap '[ -n "$collector" ] && kill $collector 2>/dev/null; rm -rf "$work"' EXIT
export TMPDIR="$work"
# The same build settings as the test command's (Package.swift), so neither rebuilds after the other.
export CRASHCAPTURE_WARNINGS_AS_ERRORS=1
Scripts/install-dependencies.sh
echo "== building (a first build takes about 5 minutes on 2 cores; its output goes to $demo/build.log)"
if ! { swift build && Scripts/build-preload.sh; } >"$demo/build.log" 2>&1; then
    tail -n 40 "$demo/build.log" >&2
    echo "the build failed: all of its output is in $demo/build.log" >&2
    exit 1
fi
bin=.build/debug
crashes="$demo/crashes"

"$bin/crashcap" collect --port 0 --db "$demo/collector.sqlite" >"$demo/collector.log" 2>&1 &
collector=$!
for _ in $(seq 1 100); do grep -qs "listening on" "$demo/collector.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$demo/collector.log")
echo "== local collector at $url"

echo "== crash-sample-swift: tracks 3 events, then dereferences a bad pointer, under capture"
set +e
CRASHCAPTURE_DIR="$crashes" CRASH_SAMPLE_EVENTS=3 SWIFT_BACKTRACE=enable=no \
    "$bin/crash-sample-swift" pipeline-crash >/dev/null 2>&1
status=$?
set -e
echo "== it died as it would have without us: exit status $status (128 + SIGSEGV = 139)"

echo "== crashcap show $crashes"
"$bin/crashcap" show "$crashes" --frames 10

echo "== crashcap replay $crashes --upload $url"
"$bin/crashcap" replay "$crashes" --upload "$url"

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
echo "== kept in $demo: the crash directory $crashes (its crash now in its store:"
echo "   $bin/crashcap list $crashes, $bin/crashcap show $crashes), the collector's database, the build's log"

#!/bin/sh
# A crash report at the format's maxima (issue #42): 513 threads of 128 frames or more, the C
# sample's threads each parked 140 calls deep. Measures, with the release `crashcap` a user
# installs, the time and peak resident memory of `show --json` of the crash file, `replay` of
# it into the store, and `show --json` / `show` of the stored crash; beside `crashcap --help`
# in the same run, the process's own floor. Run after `swift build`; builds the release CLI.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
runs=${RUNS:-5}
swift build -c release --product crashcap >/dev/null
crashcap="$root/.build/release/crashcap"
work=$(mktemp -d "${TMPDIR:-/tmp}/max-report.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/crash" "$work/small"
# The reference: the same sample with one thread, a few frames.
CRASHCAPTURE_DIR="$work/small" CRASH_SAMPLE_THREADS=1 SWIFT_BACKTRACE=enable=no \
    "$root/.build/debug/crash-sample-c" parked-threads >/dev/null 2>&1 || true
CRASHCAPTURE_DIR="$work/crash" CRASH_SAMPLE_THREADS=513 CRASH_SAMPLE_DEPTH=140 SWIFT_BACKTRACE=enable=no \
    "$root/.build/debug/crash-sample-c" parked-threads >/dev/null 2>&1 || true
file=$(ls "$work/crash"/crash-*.ccr)
echo "crash file: $(($(stat -c %s "$file") / 1024)) KiB, threads: $("$crashcap" show "$work/crash" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(len(r["threads"]), "frames each at most", max(len(t.get("frames",[])) for t in r["threads"]))')"

# One figure: the median and the largest of $runs runs, seconds and MiB.
measure() {
    label=$1
    shift
    : >"$work/times"
    for _ in $(seq 1 "$runs"); do
        [ -n "${prepare:-}" ] && eval "$prepare"
        /usr/bin/time -f "%e %M" -o "$work/one" "$@" >/dev/null 2>&1
        cat "$work/one" >>"$work/times"
    done
    sort -n "$work/times" | awk -v label="$label" '{ t[NR] = $1; if ($2 > m) m = $2 } END {
        printf "| %s | %.2f s | %.2f s | %.1f MiB |\n", label, t[int((NR + 1) / 2)], t[NR], m / 1024 }'
}

echo
echo "| $runs runs each | median | largest | peak resident memory (largest) |"
echo "|---|---|---|---|"
prepare="" measure "crashcap --help (the floor)" "$crashcap" --help
prepare='rm -rf "$work/replayed"; cp -r "$work/small" "$work/replayed"' measure "replay of a one-thread crash (the reference)" "$crashcap" replay "$work/replayed"
prepare="" measure "show --json of the one-thread crash, stored" "$crashcap" show "$work/replayed" --json
prepare="" measure "show --json of the crash file" "$crashcap" show "$work/crash" --json
prepare="" measure "show of the crash file" "$crashcap" show "$work/crash"
prepare='rm -rf "$work/replayed"; cp -r "$work/crash" "$work/replayed"' measure "replay" "$crashcap" replay "$work/replayed"
prepare="" measure "show --json of the stored crash" "$crashcap" show "$work/replayed" --json
prepare="" measure "show of the stored crash" "$crashcap" show "$work/replayed"

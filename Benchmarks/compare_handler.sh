#!/bin/sh
# Handler time of this checkout against another build, crash by crash: the two samples crash
# alternately (so that both meet the same disk and the same load), each into a directory of its
# own, and the medians and p90s of each side's timing records are printed.
#
#   sh Benchmarks/compare_handler.sh OTHER_CHECKOUT [CRASHES] [PARENT_DIRECTORY] [SAMPLE_KIND]
#
# OTHER_CHECKOUT holds a release crash-sample-c (git worktree add /tmp/old COMMIT, then in it:
# swift build -c release --disable-default-traits --product crash-sample-c). PARENT_DIRECTORY
# is where the crash directories go: /tmp (the disk, default) or /dev/shm (tmpfs, no flush:
# the handler's own work alone).
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
. "$here/Benchmarks/compare_setup.sh"
crashes="${2:-60}"
kind="${4:-deep-stack-64}"
crashcap="$here/.build/release/crashcap"
compare_setup "$1" "${3:-/tmp}" compare "$crashcap"
ulimit -c 0
i=0
while [ "$i" -lt "$crashes" ]; do
    CRASHCAPTURE_DIR="$this_dir" SWIFT_BACKTRACE=enable=no "$this_sample" "$kind" >/dev/null 2>&1 || true
    CRASHCAPTURE_DIR="$other_dir" SWIFT_BACKTRACE=enable=no "$other_sample" "$kind" >/dev/null 2>&1 || true
    i=$((i + 1))
done
for side in this other; do
    dir="$this_dir"
    [ "$side" = other ] && dir="$other_dir"
    for file in "$dir"/*.ccr; do "$crashcap" show --json "$file"; echo; done | SIDE="$side" python3 -c '
import json, os, statistics, sys
rows = [json.loads(line)["timing"] for line in sys.stdin if line.strip()]
def figure(key):
    values = sorted(row[key] / 1e6 for row in rows)
    return "%.3f / %.3f" % (statistics.median(values), values[int(len(values) * 0.9)])
print("%-5s %3d crashes, ms median / p90: handler %s, flush %s, naming %s, write %s" % (
    os.environ["SIDE"], len(rows), figure("handler_ns"), figure("fdatasync_ns"), figure("publish_ns"),
    figure("write_ns")))'
done

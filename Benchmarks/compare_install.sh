#!/bin/sh
# install() of this checkout against another build, alternately, each in a fresh process and a
# directory of its own (already initialised after the first): the medians and p90s of the
# time and of the resident memory added, as crash-sample-c measure-install reports them.
#
#   sh Benchmarks/compare_install.sh OTHER_CHECKOUT [INSTALLS]
#
# OTHER_CHECKOUT holds a release crash-sample-c, as for Benchmarks/compare_handler.sh.
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
. "$here/Benchmarks/compare_setup.sh"
installs="${2:-30}"
compare_setup "$1" /tmp compare-install
i=0
while [ "$i" -lt "$installs" ]; do
    CRASHCAPTURE_DIR="$this_dir" "$this_sample" measure-install >> "$this_dir.json"
    CRASHCAPTURE_DIR="$other_dir" "$other_sample" measure-install >> "$other_dir.json"
    i=$((i + 1))
done
for side in this other; do
    file="$this_dir.json"
    [ "$side" = other ] && file="$other_dir.json"
    SIDE="$side" python3 -c '
import json, os, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
times = sorted(row["install_ns"] / 1000 for row in rows)
added = sorted(row["rss_after_kb"] - row["rss_before_kb"] for row in rows)
print("%-5s %3d installs: %.0f us median, p90 %.0f us; resident memory added %d KiB median" % (
    os.environ["SIDE"], len(rows), statistics.median(times), times[int(len(times) * 0.9)],
    statistics.median(added)))' "$file"
    rm -f "$file"
done

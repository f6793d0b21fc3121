#!/bin/sh
# Builds Examples/MinimalApp, an app outside this package against the CrashCapture product
# alone, as a user's build does: without this package's warnings-as-errors (Package.swift), so
# that its log shows every warning an app's build would show. AppLinkTests read the log (no
# warning of ours) and run the app. From scratch whenever a source of ours changed since the
# last build, so that all of ours is compiled and every warning shows; otherwise not at all.
set -eu
cd "$(dirname "$0")/.."
scratch=.build/minimal-app
log="$scratch/build.log"
stamp="$scratch/sources.stamp"
if [ -f "$stamp" ] && [ -f "$log" ] && [ -x "$scratch/debug/minimal-app" ] &&
    [ -z "$(find Sources Package.swift Examples/MinimalApp/Package.swift Examples/MinimalApp/Sources \
        Scripts/build-minimal-app.sh -newer "$stamp" -print | head -n 1)" ]; then
    echo "up to date: $scratch/debug/minimal-app (nothing of ours changed since its build)"
    exit 0
fi
rm -rf "$scratch"
mkdir -p "$scratch"
# Before the build: a source changed while it runs is seen by the next one.
touch "$stamp"
if ! env -u CRASHCAPTURE_WARNINGS_AS_ERRORS swift build --package-path Examples/MinimalApp --scratch-path "$scratch" \
    >"$log" 2>&1; then
    cat "$log"
    rm -f "$stamp"
    exit 1
fi
grep "warning:" "$log" || true
echo "built $scratch/debug/minimal-app from scratch (its output in $log)"

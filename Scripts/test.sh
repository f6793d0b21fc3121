#!/bin/sh
# Every test: builds everything (the samples, the CLI, the C-only preload library) and runs
# the whole suite, crash tests included.
set -eu
cd "$(dirname "$0")/.."
# Everything this run puts in the temp directory (the toolchain's own TemporaryDirectory.*
# folders, the tests' crash directories and stores, built samples) goes into one folder of its
# own, removed at the end, whatever the outcome: a run leaves nothing behind.
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/crashcap-run.XXXXXX")
trap 'rm -rf "$run_tmp"' EXIT
# As /tmp is: some tests run a child as another user, which must reach its own folder here.
chmod 1777 "$run_tmp"
export TMPDIR="$run_tmp"
# A warning in any target of ours fails the build (Package.swift); dependencies are left alone.
export CRASHCAPTURE_WARNINGS_AS_ERRORS=1
Scripts/install-dependencies.sh --for build
# What only the tests use (ClickHouse, lldb, chromium, the Python packages: minutes to download
# on a new machine) is installed while everything builds, and waited for before the tests.
dependencies_log="$run_tmp/dependencies.log"
Scripts/install-dependencies.sh --for tests >"$dependencies_log" 2>&1 &
dependencies=$!
trap 'kill "$dependencies" 2>/dev/null || true; rm -rf "$run_tmp"' EXIT
swift build
# The harness also proves the samples built with optimisation (different traps and inlining).
# They do not upload, so they are built without the HTTP client (package trait HTTPUpload),
# which would add minutes of SwiftNIO and BoringSSL built in release to every run.
swift build -c release --disable-default-traits --product crash-sample-swift
swift build -c release --disable-default-traits --product crash-sample-c
Scripts/build-preload.sh
# A server-shaped app outside this package, debug, release and release with the Swift runtime
# linked in: the tests judge its crash reports beside the Swift runtime backtracer's.
Scripts/build-server-sample.sh
# An app outside this package, against the CrashCapture product alone, built as a user builds
# it: the tests check what it links, that it works, and that its build showed no warning of ours.
Scripts/build-minimal-app.sh
# What Scripts/install.sh installs, built in debug (the same layout and static linking as the
# release it installs by default) into .build-install-debug: a test installs it into a prefix
# of its own and uses it from elsewhere.
Scripts/install.sh --configuration debug --build-only
# The README's Swift app, its two blocks verbatim: a test crashes it.
Scripts/build-readme-app.sh
if ! wait "$dependencies"; then
    cat "$dependencies_log" >&2
    echo "Scripts/install-dependencies.sh --for tests failed" >&2
    exit 1
fi
cat "$dependencies_log"
swift test "$@"
# The DocC catalog: a broken symbol link or article fails the run. Only when a source changed
# since it last passed, and after the tests: the plugin's build for the symbol graphs recompiles
# SwiftProtobuf with other flags, which the next build recompiles back (20 s that a fresh
# clone's run no longer pays before its tests).
docs_stamp=.build/documentation.stamp
if [ ! -f "$docs_stamp" ] || [ -n "$(find Sources Package.swift -newer "$docs_stamp" -print | head -n 1)" ]; then
    touch "$docs_stamp.next"
    swift package generate-documentation --target CrashCapture --warnings-as-errors >/dev/null
    mv "$docs_stamp.next" "$docs_stamp"
fi

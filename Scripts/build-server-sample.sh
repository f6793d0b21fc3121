#!/bin/sh
# Builds CrashSamples/Server, an app outside this package, the three ways Swift servers ship:
# debug, release, and release with the Swift runtime linked in (--static-swift-stdlib). The two
# release builds share their objects (only the link differs); each binary is copied out under
# its own folder, under the name users' binaries have: .build/server-sample/{debug,release,static}-bin/server-sample.
set -eu
cd "$(dirname "$0")/../CrashSamples/Server"
scratch=../../.build/server-sample
mkdir -p "$scratch/debug-bin" "$scratch/release-bin" "$scratch/static-bin"
# Nothing is rebuilt (or relinked) when neither the sample nor the package changed since.
stamp="$scratch/sources.stamp"
if [ -f "$stamp" ] && [ -x "$scratch/debug-bin/server-sample" ] && [ -x "$scratch/release-bin/server-sample" ] &&
    [ -x "$scratch/static-bin/server-sample" ] &&
    [ -z "$(find Package.swift Sources ../../Package.swift ../../Sources ../../Scripts/build-server-sample.sh \
        -newer "$stamp" -print | head -n 1)" ]; then
    echo "up to date: $scratch/{debug,release,static}-bin/server-sample"
    exit 0
fi
rm -f "$stamp"
touch "$stamp.next"
# SwiftPM can miss a source file added to a path dependency and reuse its old build plan.
rm -f "$scratch/debug.yaml"
swift build --scratch-path "$scratch"
cp "$scratch/debug/server-sample" "$scratch/debug-bin/server-sample"
# SwiftPM keeps the last link when only --static-swift-stdlib changed: the plan and the binary
# go first, so that each release build links the way it is asked to.
rm -f "$scratch/release.yaml" "$scratch/release/server-sample"
swift build -c release --scratch-path "$scratch"
cp "$scratch/release/server-sample" "$scratch/release-bin/server-sample"
rm -f "$scratch/release.yaml" "$scratch/release/server-sample"
swift build -c release --static-swift-stdlib --scratch-path "$scratch"
cp "$scratch/release/server-sample" "$scratch/static-bin/server-sample"
mv "$stamp.next" "$stamp"

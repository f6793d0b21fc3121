#!/bin/sh
# Fuzzes the crash-file reader with libFuzzer for SECONDS (default 60), starting from the
# corpus kept in Fuzz/corpus/crashfile. New interesting inputs go to .build/fuzz/corpus;
# a crash leaves its input in .build/fuzz/ and a non-zero exit status.
#   Fuzz/run.sh [SECONDS]
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=.build/fuzz
mkdir -p "$out/corpus"
swiftc -sanitize=fuzzer,address -parse-as-library -O -module-name CrashFileFuzz \
    Fuzz/CrashFileFuzzer.swift Sources/CrashCapture/CrashFile.swift Sources/CrashCapture/CrashReport.swift \
    Sources/CrashCapture/CrashCaptureError.swift -o "$out/crashfile-fuzzer"
"$out/crashfile-fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
    -artifact_prefix="$out/" "$out/corpus" Fuzz/corpus/crashfile

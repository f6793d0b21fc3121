#!/bin/sh
# Fuzzes a parser with libFuzzer (and AddressSanitizer) for SECONDS (default 60):
#   Fuzz/run.sh [SECONDS] [crashfile|jsonscanner]
# crashfile: the crash-file reader; jsonscanner: the collector's batch validator, checked
# against Foundation's parser. Runs start from the corpus in Fuzz/corpus/TARGET; new inputs go
# to .build/fuzz/TARGET; a crash leaves its input in .build/fuzz/ and a non-zero exit status.
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
target=${2:-crashfile}
out=.build/fuzz
mkdir -p "$out/$target"
case "$target" in
crashfile)
    sources="Fuzz/CrashFileFuzzer.swift Sources/CrashFileFormat/*.swift"
    ;;
jsonscanner)
    sources="Fuzz/JSONScannerFuzzer.swift Sources/CrashCaptureCollector/JSONScanner.swift"
    ;;
*)
    echo "unknown fuzz target $target: crashfile or jsonscanner" >&2
    exit 64
    ;;
esac
# shellcheck disable=SC2086
swiftc -sanitize=fuzzer,address -parse-as-library -O -module-name Fuzz -package-name CrashCapture -I Sources/CCrashFileFormat/include $sources -o "$out/$target-fuzzer"
"$out/$target-fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
    -artifact_prefix="$out/$target-" "$out/$target" "Fuzz/corpus/$target"

#!/bin/sh
# The report of a real Swift server built the way servers ship, beside the Swift runtime
# backtracer's of the same crash: the Hummingbird app of Benchmarks/HummingbirdApp, built in
# release with the Swift runtime shared and linked in (--static-swift-stdlib), crashed over
# HTTP on /checkout twice and /refund once under CrashCapture, and once more under the
# backtracer alone. Prints each report's title, fingerprint, the app's and async frames, and
# which of the backtracer's app and [async] frames our report lacks. Needs the Hummingbird
# package (a first release build takes several minutes); run after `swift build`.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
crashcap="$root/.build/debug/crashcap"
scratch="$root/.build/hummingbird-app"
work=$(mktemp -d "${TMPDIR:-/tmp}/server-report.XXXXXX")
trap 'rm -rf "$work"' EXIT
helper=$(dirname "$(readlink -f "$(command -v swift)")")/../libexec/swift/linux/swift-backtrace-static
port=18080

# Starts the app (environment in $1), posts to route $2, waits for it to die; its output in $3.
crash_once() {
    env $1 PORT=$port "$work/app" >"$3" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && break
        sleep 0.1
    done
    curl -s -o /dev/null -X POST --data '{"items":[1,2,3]}' "http://127.0.0.1:$port/$2" || true
    wait $pid || true
}

for variant in release static; do
    flags=""
    [ "$variant" = static ] && flags="--static-swift-stdlib"
    rm -f "$scratch/release.yaml" "$scratch/release/hummingbird-app"
    # shellcheck disable=SC2086
    swift build -c release $flags --package-path Benchmarks/HummingbirdApp --scratch-path "$scratch" >"$work/build.log" 2>&1 ||
        { cat "$work/build.log"; exit 1; }
    cp "$scratch/release/hummingbird-app" "$work/app"
    echo "== $variant ($(ldd "$work/app" | grep -c libswift) Swift libraries linked dynamically)"
    for route in checkout checkout refund; do
        rm -rf "$work/crashes"
        crash_once "CRASHCAPTURE_DIR=$work/crashes SWIFT_BACKTRACE=enable=no" "$route" "$work/ours.txt"
        "$crashcap" show "$work/crashes" --json >"$work/ours.json"
        setting="enable=yes,interactive=no,color=no"
        [ "$variant" = static ] && setting="$setting,swift-backtrace=$helper"
        crash_once "SWIFT_BACKTRACE=$setting" "$route" "$work/theirs.txt"
        python3 - "$route" "$work/ours.json" "$work/theirs.txt" <<'PY'
import json, re, sys
route, ours_path, theirs_path = sys.argv[1:]
report = json.load(open(ours_path))
names = []
for frame in report.get("frames", []):
    names += [i.get("function", "?") for i in frame.get("inlined", [])] + [frame.get("function", "?")]
async_names = [f.get("function", "?") for f in report.get("async_frames", [])]
names += async_names
print(f"  /{route}: {report.get('title')}  fingerprint {report.get('fingerprint')}")
print(f"    async callers: {len(async_names)}")
for name in ["handleCheckout(_:)" if route == "checkout" else "handleRefund(_:)", "CallbackResponder.respond(to:context:)",
             "RouterResponder.respond(to:context:)", "HTTPChannelHandler.handleHTTP(", "Server.run("]:
    print(f"    {name}: {'in the report' if any(name in n for n in names) else 'MISSING'}")
text = open(theirs_path).read()
lines = text.split("\n")
start = next((i for i, l in enumerate(lines) if l.startswith("Thread ") and l.endswith(" crashed:")), None)
wanted = []
if start is not None:
    for line in lines[start + 2:]:
        if not line.strip():
            break
        m = re.match(r"\s*\d+ ((?:\[[a-z]+\] )*)\s*0x[0-9a-f]+ (.*) in (\S+)(?: at .*)?$", line)
        if not m:
            continue
        marks, function, image = m.group(1), re.sub(r" \+ \d+$", "", m.group(2)), m.group(3)
        if "[async]" in marks or (image == "app" and "[system]" not in marks and "[thunk]" not in marks):
            wanted.append(function)
def same(ours, theirs):
    theirs = theirs.strip()
    return ours == theirs or ours.endswith("." + theirs) or (theirs.endswith(" in") and ours.startswith(theirs + " "))
position, missing = 0, []
for function in wanted:
    found = next((i for i in range(position, len(names)) if same(names[i], function)), None)
    if found is None:
        missing.append(function)
    else:
        position = found + 1
print(f"    backtracer's app and [async] frames: {len(wanted)}, in our report in order: {len(wanted) - len(missing)}"
      + (f"; missing: {missing}" if missing else ""))
PY
    done
done

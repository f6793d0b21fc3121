#!/bin/sh
# Builds the C-only shared libraries from the CCrashCapture sources with the C compiler
# alone: no swiftrt.o, no libswiftCore, so preloading them never brings the Swift runtime
# (and its own crash handler) into a process that did not ask for it.
#   .build/lib/libcrashcapture.so.1        the C API (soname libcrashcapture.so.1)
#   .build/lib/libcrashcapture.so          a link to it, to link against (-lcrashcapture)
#   .build/lib/libCrashCapturePreload.so   the same, installing itself when CRASHCAPTURE_DIR is set
# Nothing is rebuilt when no source, header or flag changed since the last build.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.build/lib"
mkdir -p "$out"
cc=${CC:-cc}
src="$root/Sources/CCrashCapture"
format="$root/Sources/CCrashFileFormat/include"
# The C API's ABI version: a program linked against libcrashcapture.so records
# libcrashcapture.so.1 and runs against any build of that ABI. Raise it when a change to
# crashcapture.h breaks programs built before (a struct's layout, a function removed).
abi=1
flags="-std=gnu11 -O2 -g -fPIC -fvisibility=hidden -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -I$src/include -I$format -I$src"
link="-shared -Wl,-Bsymbolic-functions -Wl,-z,defs -Wl,-soname"
stamp="$out/.built"
built_with="$cc $flags $link $abi"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$built_with" ] && [ -f "$out/libcrashcapture.so.$abi" ] &&
    [ -f "$out/libCrashCapturePreload.so" ] &&
    [ -z "$(find "$src" "$format" "$root/Scripts/build-preload.sh" -newer "$stamp" -print | head -n 1)" ]; then
    echo "up to date: $out/libcrashcapture.so.$abi and $out/libCrashCapturePreload.so"
    exit 0
fi
rm -f "$stamp"
$cc $flags $link,libcrashcapture.so.$abi -o "$out/libcrashcapture.so.$abi" "$src"/signal_safe/*.c "$src"/install/*.c "$src"/journal/*.c -ldl -lpthread
ln -sfn "libcrashcapture.so.$abi" "$out/libcrashcapture.so"
$cc $flags $link,libCrashCapturePreload.so -o "$out/libCrashCapturePreload.so" "$src"/signal_safe/*.c "$src"/install/*.c "$src"/journal/*.c "$src/preload/preload.c" -ldl -lpthread
echo "$built_with" >"$stamp"
echo "built $out/libcrashcapture.so.$abi (and its link libcrashcapture.so) and $out/libCrashCapturePreload.so"

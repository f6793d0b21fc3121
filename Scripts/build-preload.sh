#!/bin/sh
# Builds the C-only shared libraries from the CCrashCapture sources with the C compiler
# alone: no swiftrt.o, no libswiftCore, so preloading them never brings the Swift runtime
# (and its own crash handler) into a process that did not ask for it.
#   .build/lib/libcrashcapture.so          the C API, to link against (-lcrashcapture)
#   .build/lib/libCrashCapturePreload.so   the same, installing itself when CRASHCAPTURE_DIR is set
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.build/lib"
mkdir -p "$out"
cc=${CC:-cc}
src="$root/Sources/CCrashCapture"
format="$root/Sources/CCrashFileFormat/include"
flags="-std=gnu11 -O2 -g -fPIC -fvisibility=hidden -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -I$src/include -I$format -I$src"
link="-shared -Wl,-Bsymbolic-functions -Wl,-z,defs -Wl,-soname"
$cc $flags $link,libcrashcapture.so -o "$out/libcrashcapture.so" "$src"/signal_safe/*.c "$src"/install/*.c "$src"/journal/*.c -ldl -lpthread
$cc $flags $link,libCrashCapturePreload.so -o "$out/libCrashCapturePreload.so" "$src"/signal_safe/*.c "$src"/install/*.c "$src"/journal/*.c "$src/preload/preload.c" -ldl -lpthread
echo "built $out/libcrashcapture.so and $out/libCrashCapturePreload.so"

#!/bin/sh
# Installs CrashCapture under a prefix, as any Linux tool is installed:
#   bin/crashcap                            built in release with the Swift runtime linked in
#                                           (--static-swift-stdlib): runs where no toolchain is
#   lib/libcrashcapture.so.1, .so           the C API (soname libcrashcapture.so.1), and its link
#   lib/libCrashCapturePreload.so           for LD_PRELOAD into any program
#   include/crashcapture.h                  the C API's header
#   lib/pkgconfig/crashcapture.pc           pkg-config --cflags --libs crashcapture
#   share/man/man1/crashcap*.1              a page for crashcap and one for each subcommand
#   share/bash-completion, share/zsh, share/fish   completions
#   lib/systemd/system/crashcap-collect.service, crashcap-watch@.service
#
#   sh Scripts/install.sh [--prefix DIR] [--configuration release|debug] [--build-only]
#   sh Scripts/install.sh --uninstall [--prefix DIR]
#
# DIR defaults to /usr/local. DESTDIR, when set, is put before every path written (packaging);
# the installed files still name DIR. The build goes into .build-install-<configuration>, apart
# from .build, so it never makes `swift build` or the test command rebuild anything; a rerun
# rebuilds only what changed. What was installed is listed in share/crashcapture/installed-files,
# which --uninstall removes, and nothing else.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=/usr/local
configuration=release
action=install
usage() {
    echo "usage: sh Scripts/install.sh [--prefix DIR] [--configuration release|debug] [--build-only]"
    echo "       sh Scripts/install.sh --uninstall [--prefix DIR]"
}
while [ $# -gt 0 ]; do
    case $1 in
    --prefix) [ $# -ge 2 ] || { usage >&2; exit 64; }; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --configuration | -c) [ $# -ge 2 ] || { usage >&2; exit 64; }; configuration=$2; shift 2 ;;
    --configuration=*) configuration=${1#*=}; shift ;;
    --build-only) action=build; shift ;;
    --uninstall) action=uninstall; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage >&2; exit 64 ;;
    esac
done
case $configuration in
release | debug) ;;
*) echo "install.sh: --configuration is release or debug, not $configuration" >&2; exit 64 ;;
esac
case $prefix in
/*) ;;
*) echo "install.sh: --prefix must be an absolute path, not $prefix" >&2; exit 64 ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/
dest="${DESTDIR:-}$prefix"
manifest="share/crashcapture/installed-files"

# The shared library cache knows a system prefix's lib/ only after ldconfig; another prefix's
# programs find the library by their rpath.
refresh_loader_cache() {
    if [ -z "${DESTDIR:-}" ] && [ "$(id -u)" -eq 0 ] && command -v ldconfig >/dev/null; then
        case $prefix in /usr | /usr/local) ldconfig ;; esac
    fi
}

if [ "$action" = uninstall ]; then
    if [ ! -f "$dest/$manifest" ]; then
        echo "install.sh: nothing of CrashCapture is installed in $prefix (no $prefix/$manifest)" >&2
        exit 1
    fi
    # Files and links first, then the folders the install made, deepest first, when empty.
    files=$(sed -n 's/^f //p' "$dest/$manifest")
    folders=$(sed -n 's/^d //p' "$dest/$manifest" | sort -r)
    echo "$files" | while read -r path; do
        if [ -n "$path" ]; then rm -f "$dest/$path"; fi
    done
    rm -f "$dest/$manifest"
    echo "$folders" | while read -r path; do
        if [ -n "$path" ]; then rmdir "$dest/${path#.}" 2>/dev/null || true; fi
    done
    refresh_loader_cache
    echo "uninstalled CrashCapture from $prefix"
    exit 0
fi

cd "$root"
scratch="$root/.build-install-$configuration"
mkdir -p "$scratch"
log="$scratch/build.log"
build() {
    if ! "$@" >>"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "install.sh: the build failed; all of it is in $log" >&2
        exit 1
    fi
}
: >"$log"
echo "building crashcap ($configuration, the Swift runtime linked in) into $scratch; output in $log"
[ "$configuration" = release ] && echo "  (the first one builds SwiftNIO and BoringSSL in release: about 10 minutes on 2 cores)"
build swift build -c "$configuration" --static-swift-stdlib --product crashcap --scratch-path "$scratch"
crashcap="$(swift build -c "$configuration" --static-swift-stdlib --scratch-path "$scratch" --show-bin-path)/crashcap"
# The C libraries: from the same sources, by the C compiler alone (no Swift runtime in them).
build sh Scripts/build-preload.sh
# swift-argument-parser's generate-manual, the tool its GenerateManual plugin runs, run here
# directly on the crashcap being installed: the plugin would first build every product of the
# package (samples, benchmarks), and not with the Swift runtime linked in.
parser="$scratch/checkouts/swift-argument-parser"
build swift build --package-path "$parser" --scratch-path "$scratch/generate-manual" --product generate-manual
manual="$(swift build --package-path "$parser" --scratch-path "$scratch/generate-manual" --show-bin-path)/generate-manual"

stage="$scratch/stage"
rm -rf "$stage"
mkdir -p "$stage/man1"
date=$(git log -1 --format=%cs 2>/dev/null || date +%Y-%m-%d)
build "$manual" "$crashcap" --multi-page --date "$date" --output-directory "$stage/man1"
for shell in bash zsh fish; do
    "$crashcap" --generate-completion-script "$shell" >"$stage/completion.$shell"
done
version=$(sed -n 's/^#define CRASHCAPTURE_VERSION "\(.*\)"$/\1/p' Sources/CCrashCapture/include/crashcapture.h)
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" Packaging/crashcapture.pc.in >"$stage/crashcapture.pc"
for unit in crashcap-collect.service crashcap-watch@.service; do
    sed -e "s|@BINDIR@|$prefix/bin|g" "Packaging/systemd/$unit.in" >"$stage/$unit"
done
if [ "$action" = build ]; then
    echo "built; install with: sh Scripts/install.sh --prefix $prefix --configuration $configuration"
    exit 0
fi

# Every folder made and every file written is noted, for --uninstall.
notes="$stage/installed-files"
: >"$notes"
folder() {
    if [ ! -d "$dest/$1" ]; then
        folder "$(dirname "$1")"
        mkdir "$dest/$1"
        echo "d $1" >>"$notes"
    fi
}
place() { # mode source path-under-prefix
    folder "$(dirname "$3")"
    install -m "$2" "$1" "$dest/$3"
    echo "f $3" >>"$notes"
}
mkdir -p "$(dirname "$dest")"
[ -d "$dest" ] || { mkdir "$dest"; echo "d ." >>"$notes"; }
place "$crashcap" 755 bin/crashcap
place .build/lib/libcrashcapture.so.1 755 lib/libcrashcapture.so.1
ln -sfn libcrashcapture.so.1 "$dest/lib/libcrashcapture.so"
echo "f lib/libcrashcapture.so" >>"$notes"
place .build/lib/libCrashCapturePreload.so 755 lib/libCrashCapturePreload.so
place Sources/CCrashCapture/include/crashcapture.h 644 include/crashcapture.h
place "$stage/crashcapture.pc" 644 lib/pkgconfig/crashcapture.pc
for page in "$stage"/man1/*.1; do
    place "$page" 644 "share/man/man1/$(basename "$page")"
done
place "$stage/completion.bash" 644 share/bash-completion/completions/crashcap
place "$stage/completion.zsh" 644 share/zsh/site-functions/_crashcap
place "$stage/completion.fish" 644 share/fish/vendor_completions.d/crashcap.fish
place "$stage/crashcap-collect.service" 644 lib/systemd/system/crashcap-collect.service
place "$stage/crashcap-watch@.service" 644 lib/systemd/system/crashcap-watch@.service
folder share/crashcapture
# A file an earlier install noted and this one did not write stays listed, so that
# --uninstall still removes it (a man page of a subcommand since removed, say).
[ -f "$dest/$manifest" ] && cat "$dest/$manifest" >>"$notes"
awk '!seen[$0]++' "$notes" >"$dest/$manifest"
chmod 644 "$dest/$manifest"
refresh_loader_cache
echo "installed CrashCapture $version into $prefix:"
echo "  $prefix/bin/crashcap, man crashcap, completions for bash, zsh and fish"
echo "  C: cc app.c \$(pkg-config --cflags --libs crashcapture)   (pkg-config finds $prefix/lib/pkgconfig/crashcapture.pc)"
echo "  any program: LD_PRELOAD=$prefix/lib/libCrashCapturePreload.so CRASHCAPTURE_DIR=… program"
echo "  systemd: crashcap-collect.service, crashcap-watch@APP.service (systemctl daemon-reload first)"

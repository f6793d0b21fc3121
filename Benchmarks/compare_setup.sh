# Sourced by the compare_*.sh scripts. compare_setup OTHER_CHECKOUT PARENT NAME [PROGRAM...]
# sets this_sample and other_sample (this checkout's and the other build's release
# crash-sample-c), checks that they and any further PROGRAMs exist, and makes this_dir and
# other_dir under PARENT, removed at exit.
compare_setup() {
    other="$1"
    parent="$2"
    name="$3"
    shift 3
    this_sample="$here/.build/release/crash-sample-c"
    other_sample="$other/.build/release/crash-sample-c"
    for program in "$this_sample" "$other_sample" "$@"; do
        [ -x "$program" ] || { echo "missing $program (build it in release first)" >&2; exit 1; }
    done
    this_dir="$(mktemp -d "$parent/$name-this.XXXXXX")"
    other_dir="$(mktemp -d "$parent/$name-other.XXXXXX")"
    trap 'rm -rf "$this_dir" "$other_dir"' EXIT
}

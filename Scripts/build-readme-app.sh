#!/bin/sh
# Builds the app of the README's "Install into a Swift app" exactly as written there: its two
# code blocks become a package in .build/readme-app/myapp, beside a link named CrashCapture to
# this checkout (whatever this checkout's own folder is called). AppLinkTests crashes it.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
app=.build/readme-app/myapp
mkdir -p "$app/Sources/myapp"
ln -sfn "$root" .build/readme-app/CrashCapture
# The swift block that follows each marker, verbatim.
extract() {
    awk -v marker="<!-- readme-app: $1 -->" '
        $0 == marker { found = 1; next }
        found && /^```swift$/ { inside = 1; next }
        inside && /^```$/ { exit }
        inside { print }
    ' README.md
}
extract Package.swift >"$app/Package.swift.new"
extract main.swift >"$app/Sources/myapp/main.swift.new"
for file in "$app/Package.swift" "$app/Sources/myapp/main.swift"; do
    if [ ! -s "$file.new" ]; then
        echo "README.md has no block for $(basename "$file") after its readme-app marker" >&2
        exit 1
    fi
    # Unchanged blocks keep their files' times, so SwiftPM rebuilds nothing.
    if cmp -s "$file.new" "$file"; then rm "$file.new"; else mv "$file.new" "$file"; fi
done
rm -f .build/readme-app/build/debug.yaml
swift build --package-path "$app" --scratch-path .build/readme-app/build

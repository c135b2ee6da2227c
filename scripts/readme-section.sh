#!/usr/bin/env bash
# scripts/readme-section.sh NAME FILE — replaces the README's generated
# section NAME (the lines between "<!-- NAME:begin" and "<!-- NAME:end -->")
# with the contents of FILE. Used by the scripts that regenerate README
# figures from the current code.
set -euo pipefail
name=$1 content=$2
README=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/README.md
begin=$(grep -m1 "^<!-- $name:begin" "$README") || { echo "readme-section: $README lacks the $name markers" >&2; exit 1; }
end="<!-- $name:end -->"
grep -qxF "$end" "$README" || { echo "readme-section: $README lacks \"$end\"" >&2; exit 1; }
awk -v begin="$begin" -v end="$end" -v table="$content" '
	$0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
	$0 == end { skip = 0 }
	!skip { print }' "$README" >"$README.tmp"
mv "$README.tmp" "$README"

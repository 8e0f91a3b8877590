# Sourced by the WAN benchmarks: run from a copy of src/ and examples/ (editing the tree meanwhile changes
# nothing in the run), removed on exit. Sets $repo (the checkout) and $snap, cds into $snap, and sets
# PYTHONPATH to the copy's src/.
repo=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT
cp -r "$repo/src" "$repo/examples" "$snap/"
export PYTHONPATH=$snap/src

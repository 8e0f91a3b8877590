#!/usr/bin/env bash
# Mutation testing of the pure cores, src/gradwire/net/ and src/gradwire/compress/, with mutmut 3.
#
#   bash benchmarks/mutation.sh            # full run (about 20-40 min on 2 cores), then the summary
#   MUTATION_DIR=/tmp/m bash benchmarks/mutation.sh   # reuse a work folder: only changed mutants rerun
#   MUTATION_REV=HEAD bash benchmarks/mutation.sh     # mutate a commit's src/ (tests from the work tree)
#
# It copies src/ and the one-process tests (tests/net, tests/compress, tests/emulate/test_topology_auto.py) to a work folder with
# benchmarks/mutation.cfg as its setup.cfg, so the repository itself is never touched, runs
# `mutmut run` there at low priority, re-tests the survivors with the mutant written into the
# source (code that runs at import is out of mutmut's reach otherwise), and prints killed /
# survived per module (benchmarks/mutation_summary.py). Surviving mutants: `cd $MUTATION_DIR && mutmut show NAME`.
# Results and the notes on equivalent mutants: benchmarks/results/mutation.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gradwire-mutation.XXXXXX")}
python -c 'import mutmut' 2>/dev/null || python -m pip install 'mutmut>=3.8,<4'

mkdir -p "$work/tests"
rm -rf "$work/src" "$work/tests/net" "$work/tests/compress" "$work/tests/emulate"
if [ -n "${MUTATION_REV:-}" ]; then
  git -C "$root" archive "$MUTATION_REV" src | tar -x -C "$work"
else
  cp -r "$root/src" "$work/src"
fi
cp "$root/tests/__init__.py" "$work/tests/"
cp -r "$root/tests/net" "$root/tests/compress" "$work/tests/"
mkdir -p "$work/tests/emulate"  # topology=auto's pure tests (net/spec.py's resolve_topology)
cp "$root/tests/emulate/__init__.py" "$root/tests/emulate/conftest.py" "$root/tests/emulate/test_topology_auto.py" \
  "$work/tests/emulate/"
cp "$root/benchmarks/mutation.cfg" "$work/setup.cfg"
find "$work" -name __pycache__ -prune -exec rm -rf {} +

cd "$work"
echo "mutation work folder: $work"
nice -n 10 python -m mutmut run --max-children "${MUTATION_JOBS:-2}" || true
nice -n 10 python "$root/benchmarks/mutation_summary.py" --root "$root" --recheck | tee summary.txt

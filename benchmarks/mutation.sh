#!/usr/bin/env bash
# Mutation testing of the pure cores, src/gradwire/net/ and src/gradwire/compress/, with mutmut 3.
#
#   bash benchmarks/mutation.sh            # every mutant (about 3000: hours on a busy 2-core machine)
#   MUTATION_DIR=/tmp/m bash benchmarks/mutation.sh   # reuse a work folder: only changed mutants rerun
#   MUTATION_REV=HEAD bash benchmarks/mutation.sh     # mutate a commit's src/ (tests from the work tree)
#   MUTATION_SAMPLE=0.25 MUTATION_JOBS=4 bash benchmarks/mutation.sh   # a random quarter of each module
#
# It copies src/ and the one-process tests of net/ and compress/ (tests/net, tests/compress,
# tests/emulate/test_topology_auto.py) to a work folder with
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
jobs=${MUTATION_JOBS:-2}
if [ -n "${MUTATION_SAMPLE:-}" ]; then
  # a random fraction of every module's mutants (seed 0): mutmut generates every mutant and collects the
  # tests' coverage first (the filter that matches nothing stops it right after), then runs the sample
  nice -n 10 python -m mutmut run "no-such-mutant" >/dev/null 2>&1 || true
  python "$root/benchmarks/mutation_summary.py" --root "$root" --sample "$MUTATION_SAMPLE" > sample.txt
  nice -n 10 python -m mutmut run --max-children "$jobs" $(cat sample.txt) || true
else
  nice -n 10 python -m mutmut run --max-children "$jobs" || true
fi
nice -n 10 python "$root/benchmarks/mutation_summary.py" --root "$root" --recheck | tee summary.txt

"""Summarise a mutmut 3 run per module; re-test its survivors with the mutant written into the source.

Used by benchmarks/mutation.sh, in the work folder of the run::

    python benchmarks/mutation_summary.py --root REPO [--recheck]

mutmut 3 switches mutants inside functions at call time. Code that runs at
import (the tables built by ``_sign_table``, the registry filled by
``register_compressor``, ``_with_barrier`` building ``ALGORITHMS``) has run
before a mutant is switched on, so such mutants always "survive" there.
``--recheck`` finds the functions that run while ``gradwire.net`` and
``gradwire.compress`` are imported (a profiler over the import), writes each
of their surviving mutants into the copied source (``mutmut apply``), runs
the pure tests in a fresh interpreter, and restores the file: a failing run
kills the mutant.

Surviving mutants explained in benchmarks/mutation_equivalent.txt
(``NAME  # tag: why``) are counted under their tag: ``equivalent`` (no
input can tell), ``cpu`` (differs on a CUDA device only) or ``infeasible``.
The score is killed / (all - equivalent).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<name>[\w.ǁ]+__mutmut_\d+): (?P<status>.+?)\s*$")
TESTS = ["tests/net", "tests/compress", "tests/emulate/test_topology_auto.py", "-m", "not slow"]


def mutmut_results(where: Path = Path(".")) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], check=True,
                         capture_output=True, text=True, cwd=where).stdout
    return {m["name"]: m["status"] for m in map(LINE.match, out.splitlines()) if m}


def module_of(name: str) -> str:
    """``gradwire.net.algorithms.x_ring__mutmut_3`` -> ``gradwire.net.algorithms``."""
    head = name.split("__mutmut_")[0]
    parts = head.split(".")
    return ".".join(p for p in parts if not (p.startswith("x_") or p.startswith("xǁ")))


def source_file(name: str) -> Path:
    mod = module_of(name).replace(".", "/")
    return Path("src") / (mod + ".py") if Path("src", mod + ".py").exists() else Path("src", mod, "__init__.py")


def recheck(names: list[str], root: Path, timeout: int = 180) -> dict[str, str]:
    """Write each mutant into the copied source, run the pure tests in a fresh process, restore."""
    env = {**os.environ, "PYTHONPATH": str(Path("src").resolve())}
    verdict = {}
    for i, name in enumerate(names, 1):
        path = source_file(name)
        try:
            subprocess.run([sys.executable, "-m", "mutmut", "apply", name], check=True, capture_output=True)
            try:
                # the mutant's own package's tests first: -x stops at the first failure
                own = f"tests/{module_of(name).split('.')[1]}"
                tests = [own, *(t for t in TESTS if t != own)]
                rc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                                    env=env, capture_output=True, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = -1
        finally:
            shutil.copyfile(root / path, path)
        verdict[name] = "survived" if rc == 0 else ("timeout" if rc == -1 else "killed")
        print(f"  recheck {i}/{len(names)} {name}: {verdict[name]}", flush=True)
    return verdict


_PROFILE_IMPORT = """
import sys
seen = set()
def prof(frame, event, arg):
    if event == "call" and "/gradwire/" in frame.f_code.co_filename:
        seen.add((frame.f_globals.get("__name__"), frame.f_code.co_qualname))
sys.setprofile(prof)
import gradwire.net, gradwire.compress
sys.setprofile(None)
for mod, name in sorted(seen):
    print(mod, name)
"""


def import_time_functions() -> set[tuple[str, str]]:
    """(module, qualified name) of every gradwire function called while net/ and compress/ are imported."""
    env = {**os.environ, "PYTHONPATH": str(Path("src").resolve())}
    out = subprocess.run([sys.executable, "-c", _PROFILE_IMPORT], env=env, check=True, capture_output=True,
                         text=True).stdout
    return {tuple(line.split(" ", 1)) for line in out.splitlines()}


def function_of(name: str) -> tuple[str, str]:
    """``gradwire.compress.onebit.xǁOneBitCompressorǁcombine__mutmut_3`` -> (module, ``OneBitCompressor.combine``)."""
    head = name.split("__mutmut_")[0]
    last = head.split(".")[-1]
    qual = ".".join(p for p in last[1:].split("ǁ") if p) if last.startswith("xǁ") else last[2:]
    return module_of(name), qual


def sample(status: dict[str, str], fraction: float, seed: int = 0) -> list[str]:
    """A random ``fraction`` of every module's mutants (at least 10, or all of a smaller module)."""
    by_module: dict[str, list[str]] = defaultdict(list)
    for name in sorted(status):
        by_module[module_of(name)].append(name)
    rng = random.Random(seed)
    picked = []
    for mod in sorted(by_module):
        names = by_module[mod]
        picked += rng.sample(names, min(len(names), max(10, round(fraction * len(names)))))
    return picked


def equivalents(root: Path) -> dict[str, str]:
    """NAME -> tag (equivalent, cpu or infeasible) from benchmarks/mutation_equivalent.txt."""
    path = root / "benchmarks" / "mutation_equivalent.txt"
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, why = line.partition("#")
        if name.strip():
            out[name.strip()] = why.strip().partition(":")[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="the repository (for pristine sources and notes)")
    ap.add_argument("--recheck", action="store_true", help="re-test survivors with the mutant applied")
    ap.add_argument("--merge", type=Path, action="append", default=[],
                    help="another work folder of the same sources (e.g. `mutmut run 'gradwire.net.*'` run beside "
                         "this one): its verdicts fill in the mutants not checked here")
    ap.add_argument("--sample", type=float, default=None, metavar="FRACTION",
                    help="print a random FRACTION of every module's mutants (seed 0), one name a line, and exit")
    args = ap.parse_args()
    if args.sample is not None:
        print("\n".join(sample(mutmut_results(), args.sample)))
        return
    status = mutmut_results()
    for other in args.merge:
        for name, verdict in mutmut_results(other).items():
            if status.get(name, "not checked") == "not checked":
                status[name] = verdict
    if args.recheck:
        at_import = import_time_functions()
        todo = [n for n, s in status.items() if s in ("survived", "no tests") and function_of(n) in at_import]
        for name, v in recheck(todo, args.root.resolve()).items():
            status[name] = "killed" if v in ("killed", "timeout") else status[name]
    equiv = equivalents(args.root)
    for name, tag in equiv.items():
        if name in status and status[name] in ("survived", "no tests"):
            status[name] = tag
    by_module: dict[str, Counter] = defaultdict(Counter)
    for name, s in status.items():
        if s != "not checked":  # a sampled run leaves the rest unchecked
            by_module[module_of(name)][s] += 1
    cols = ["killed", "survived", "no tests", "timeout", "equivalent", "cpu", "infeasible"]
    print(f"\n| module | mutants | {' | '.join(cols)} | score |")
    print("|---|---:|" + "---:|" * (len(cols) + 1))
    total: Counter = Counter()
    for mod in sorted(by_module):
        c = by_module[mod]
        total.update(c)
        print(_row(mod, c, cols))
    print(_row("**all**", total, cols))
    left = sorted(n for n, s in status.items() if s in ("survived", "no tests"))
    stale = sorted(n for n in equiv if status.get(n) in ("killed", "timeout"))
    print(f"\nnot killed, not explained in mutation_equivalent.txt ({len(left)}):")
    for name in left:
        print(f"  {name}")
    if stale:
        print(f"\nlisted as equivalent but killed ({len(stale)}; remove from mutation_equivalent.txt):")
        for name in stale:
            print(f"  {name}")


def _row(mod: str, c: Counter, cols: list[str]) -> str:
    n = sum(c.values())
    killed = c["killed"] + c["timeout"]
    denom = n - c["equivalent"]
    score = f"{killed / denom:.1%}" if denom else "-"
    other = n - sum(c[k] for k in cols)
    extra = f" (+{other} other)" if other else ""
    return f"| {mod} | {n}{extra} | " + " | ".join(str(c[k]) for k in cols) + f" | {score} |"


if __name__ == "__main__":
    main()

"""`gradwire compare`: every strategy on real training, on simulated networks.

Two kinds of training: the bundled digits models (:mod:`.runner`) and a
user's own script, run unchanged (:mod:`.script`); both keep their books
in a :class:`.ledger.Ledger` and give :mod:`.results` dataclasses, turned
into rows (:mod:`.report`) and plots.
"""
from gradwire.compare.config import COMPUTE_ONLY, DEFAULT_NET, DEFAULT_STRATEGIES, CompareConfig
from gradwire.compare.report import Row, print_table, rows_of, to_markdown
from gradwire.compare.results import Curve, Results, Run, SeedResult, TrainingEvent
from gradwire.compare.runner import Training, run_compare, schedule
from gradwire.compare.script import DEFAULT_SCRIPT_STRATEGIES, ScriptConfig, run_script_compare

__all__ = ["COMPUTE_ONLY", "DEFAULT_NET", "DEFAULT_SCRIPT_STRATEGIES", "DEFAULT_STRATEGIES", "CompareConfig", "Curve",
           "Results", "Row", "Run", "ScriptConfig", "SeedResult", "Training", "TrainingEvent", "print_table",
           "rows_of", "run_compare", "run_script_compare", "schedule", "to_markdown"]

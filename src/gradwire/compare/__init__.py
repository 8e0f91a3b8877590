"""`gradwire compare`: every strategy on real training, on simulated networks."""
from gradwire.compare.config import COMPUTE_ONLY, DEFAULT_NET, DEFAULT_STRATEGIES, CompareConfig
from gradwire.compare.report import Row, print_table, rows_of, to_markdown
from gradwire.compare.runner import Training, run_compare, schedule

__all__ = ["COMPUTE_ONLY", "DEFAULT_NET", "DEFAULT_STRATEGIES", "CompareConfig", "Row", "Training", "print_table",
           "rows_of", "run_compare", "schedule", "to_markdown"]

"""Evaluation: metrics, a runner over benchmark folders, significance tests, tables and plots."""

from .metrics import completeness_at_k, mrr_at_k, ndcg_at_k, precision_at_k, query_metrics, recall_at_k
from .report import format_table, plot_reports
from .runner import SearchSystem, evaluate
from .significance import BootstrapResult, paired_bootstrap, paired_bootstrap_per_set
from .summary import EvalReport, SetReport

__all__ = [
    "ndcg_at_k", "recall_at_k", "completeness_at_k", "mrr_at_k", "precision_at_k", "query_metrics",
    "evaluate", "SearchSystem", "EvalReport", "SetReport",
    "paired_bootstrap", "paired_bootstrap_per_set", "BootstrapResult",
    "format_table", "plot_reports",
]

"""Synthetic labelled queries for a catalog (ToolBank, the Tool2Vec paper §3): pick tools that fit, write, polish, dedupe.

    from toolscout.generate import GenerateConfig, generate_queries
    result = generate_queries(tools, client, GenerateConfig(n=500))
"""

from .dedupe import NearDuplicateIndex, similarity
from .pipeline import GenerateConfig, GenerateReport, GenerateResult, check_pick, generate_queries

__all__ = ["GenerateConfig", "GenerateReport", "GenerateResult", "generate_queries", "check_pick",
           "NearDuplicateIndex", "similarity"]

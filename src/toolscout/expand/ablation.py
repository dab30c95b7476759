"""Compare text views on benchmark sets: the profile-field ablation (the Tool-REX paper §2.4) and usage expansion.

    python -m toolscout.expand.ablation SET_DIR... --retriever bm25 --protocol add-one
    python -m toolscout.expand.ablation SET_DIR... --retriever dense --protocol one-out --json out.json
    python -m toolscout.expand.ablation SET_U20... --retriever bm25 --usage-grid 0,5,20

Add-One starts from the original document (no profile field) and adds one field; One-Out starts from
all fields and removes one. `--usage-grid` compares appending 0, 5, 20... known requests per tool (the
sets must carry them: `toolscout expand SET --usage 20 --out SET_U20`). Each view is evaluated the way
`toolscout eval` does (same runner, each set over its own tools), one view after another.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Mapping, Sequence

from ..benchmark_sets import BenchmarkSet
from ..tool import PROFILE_FIELDS, TextView
from .catalog import read_catalog
from .views import PROTOCOLS, ablation_views, make_view, parse_profile_fields


def load_sets(paths: Sequence[str | Path]) -> list[BenchmarkSet]:
    """Benchmark folders with every tool field kept (profile, and the `usage` rows written by expand)."""
    sets = []
    for path in paths:
        catalog = read_catalog(path, format="jsonl")
        sets.append(BenchmarkSet(Path(path).name, catalog.tools, catalog.queries, Path(path)))
    return sets


def usage_views(grid: Sequence[int], base: TextView | None = None) -> dict[str, TextView]:
    return {("plain" if n == 0 else f"usage={n}"): make_view(usage=n, base=base) for n in grid}


def compare_views(sets: Sequence[BenchmarkSet], retriever: str, views: Mapping[str, TextView], *, k: int = 10,
                  split: str = "test", model: str | None = None, progress: bool = True,
                  max_queries: int | None = None) -> dict:
    """view name → EvalReport for `retriever` built with that view."""
    from ..eval import evaluate
    from ..pipeline import ToolScout

    options: dict = {}
    if retriever != "bm25":
        from ..encoders import Encoder

        options["encoder"] = Encoder.load(model)
    reports = {}
    for name, view in views.items():
        def factory(tools, view=view):
            return ToolScout.from_tools(tools, retriever=retriever, view=view, **options)

        reports[name] = evaluate(sets, factory, k=k, split=split, name=f"{retriever}[{name}]", progress=progress,
                                 max_queries=max_queries)
        if progress:
            print(f"  {retriever} {name}: mean ndcg@{k} {reports[name].mean[f'ndcg@{k}']:.2f}", file=sys.stderr)
    return reports


def format_comparison(reports: Mapping[str, object], k: int = 10, metric: str = "ndcg") -> str:
    """Rows: views; columns: sets and the mean; Δ against the first row (the baseline)."""
    key = f"{metric}@{k}"
    names = list(reports)
    sets = list(reports[names[0]].sets)
    header = f"{'view':<22}" + "".join(f"{s[:16]:>17}" for s in sets) + f"{'mean':>9}{'Δ mean':>9}"
    lines = [f"{key}", header, "-" * len(header)]
    base = reports[names[0]].mean[key]
    for name in names:
        r = reports[name]
        cells = "".join(f"{r.sets[s].metrics[key]:>17.2f}" for s in sets)
        lines.append(f"{name:<22}{cells}{r.mean[key]:>9.2f}{r.mean[key] - base:>+9.2f}")
    return "\n".join(lines)


def significance(reports: Mapping[str, object], k: int = 10, n_resamples: int = 10000) -> dict[str, dict]:
    """Paired bootstrap of each view against the baseline (the first), per set: view → set → result."""
    from ..eval import paired_bootstrap_per_set

    names = list(reports)
    base = reports[names[0]]
    return {name: {s: r.to_dict() for s, r in paired_bootstrap_per_set(base, reports[name], f"ndcg@{k}",
                                                                         n_resamples).items()}
            for name in names[1:]}


def format_significance(tests: Mapping[str, Mapping[str, dict]], baseline: str) -> str:
    lines = [f"paired bootstrap vs {baseline} (Δ nDCG points [95% CI], one-sided p of 'better')"]
    for name, per_set in tests.items():
        cells = "; ".join(f"{s} {r['diff']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] p={r['p_one_sided']:.4f}"
                          for s, r in per_set.items())
        lines.append(f"  {name}: {cells}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolscout.expand.ablation",
                                     description="Compare text views (profile fields, usage) on benchmark sets.")
    parser.add_argument("sets", nargs="+", metavar="SET_DIR")
    parser.add_argument("--retriever", action="append", default=None, help="bm25 or dense (repeatable; default bm25)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default=None, help="profile-field ablation protocol")
    parser.add_argument("--fields", default="all", help="fields the protocol varies (default: all five)")
    parser.add_argument("--usage-grid", default=None, metavar="N,N,...", help="compare usage counts, e.g. 0,5,20")
    parser.add_argument("--profile-fields", default=None, help="profile fields of the usage-grid views")
    parser.add_argument("--model", default=None, help="encoder for dense")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--bootstrap", type=int, default=10000, metavar="N",
                        help="paired-bootstrap resamples against the baseline view, per set (0: skip)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write every report as JSON")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if (args.protocol is None) == (args.usage_grid is None):
        parser.error("give exactly one of --protocol and --usage-grid")
    if args.protocol:
        views = ablation_views(args.protocol, parse_profile_fields(args.fields) or PROFILE_FIELDS)
    else:
        base = make_view(parse_profile_fields(args.profile_fields)) if args.profile_fields else None
        views = usage_views([int(n) for n in args.usage_grid.split(",")], base)
    sets = load_sets(args.sets)
    out = {}
    for retriever in args.retriever or ["bm25"]:
        reports = compare_views(sets, retriever, views, k=args.k, split=args.split, model=args.model,
                                progress=not args.quiet, max_queries=args.max_queries)
        print(f"\n{retriever}")
        print(format_comparison(reports, args.k))
        tests = significance(reports, args.k, args.bootstrap) if args.bootstrap else {}
        if tests:
            print(format_significance(tests, next(iter(reports))))
        out[retriever] = {name: {"view": views[name].to_dict(), **r.to_json(), "vs_baseline": tests.get(name)}
                          for name, r in reports.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

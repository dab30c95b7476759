"""`toolscout eval SET_DIR...`: evaluate retrievers (and rerankers) on benchmark folders, compare them with
a paired bootstrap, write the `eval --json` report and a chart."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_RETRIEVER

ENCODER_BACKENDS = ("auto", "exact", "torch", "onnx", "onnx-int8")  # toolscout.encoders.BACKENDS, without importing it
from .options import (add_fast_queries, add_rerank_options, add_retriever_options, check_trained_model,
                      flags_for_model, intents_from_args, model_for, number_in, reranker_from_args, retriever_options,
                      retriever_systems)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate retrievers on benchmark folders")
    p.add_argument("sets", nargs="+", metavar="SET_DIR", help="benchmark folders (tools.jsonl + queries.jsonl)")
    add_retriever_options(p, many=True)
    add_rerank_options(p)
    p.add_argument("--also-k", default="", metavar="K,K",
                   help="also report the metrics at these smaller cut-offs, e.g. 5 (from the same rankings)")
    p.add_argument("--with-first-stage", action="store_true",
                   help="with --rerank: also evaluate each first stage alone, and compare the two (paired bootstrap)")
    p.add_argument("-k", type=int, default=10, help="cut-off for the metrics (default %(default)s)")
    p.add_argument("--pooled", action="store_true", help="search the union of all sets' tools")
    p.add_argument("--split", default="test", help="query split to evaluate (default %(default)s)")
    p.add_argument("--max-queries", type=number_in(int, 1), default=None, metavar="N",
                   help="evaluate at most N queries per set: the first N of the split in file order (the same ones "
                        "every run), which may not represent the split: sealtools' first 150 test queries all "
                        "need one tool, while 78%% of its test split needs several")
    p.add_argument("--per-category", action="store_true",
                   help="also print metrics per tool category (and write them to --json, under per_category)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write metrics and latency as JSON, and each query's metrics and ranked ids (per_query)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="bar chart comparing the systems")
    p.add_argument("--bootstrap", type=_resamples, default=10000, metavar="N",
                   help="paired-bootstrap resamples when comparing systems (default %(default)s, at least 40; "
                        "0: no comparison)")
    add_fast_queries(p, saved=False)
    p.add_argument("--encoder-backend", default="auto", choices=ENCODER_BACKENDS,
                   help="how dense encoders compute vectors: auto (the default: the int8 ONNX encoding where the "
                        "model's quality check passed, else float32 ONNX), exact (float32 only), torch "
                        "(sentence-transformers, float32; needs toolscout[train]), onnx, onnx-int8")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from ..benchmark_sets import load_benchmark
    from ..eval.report import counted

    _check_outputs(args)
    reranker = reranker_from_args(args)
    sets = [load_benchmark(s) for s in args.sets]
    asked = _systems_asked(args, reranker)
    reports: list = []
    try:
        for report in _evaluated(args, sets, asked):
            reports.append(report)
    except KeyboardInterrupt:  # Ctrl-C: what finished is kept (printed, written), then the run stops as asked
        if reports:
            print(f"toolscout eval: interrupted; reporting the {counted(len(reports), 'system')} that finished",
                  file=sys.stderr)
            _report(reports, args, list(asked), interrupted=True)
        raise
    _report(reports, args, list(asked))
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """--plot and --json, refused before the evaluation rather than after it."""
    from ..errors import require

    if args.plot:  # a lean install has no matplotlib, and a format it cannot write
        require("matplotlib", feature="plotting evaluation reports (--plot)", extra="plot")
        from matplotlib.figure import Figure

        kinds = Figure().canvas.get_supported_filetypes()
        kind = Path(args.plot).suffix.lstrip(".").lower()
        if kind not in kinds:
            raise ValueError(f"--plot {args.plot}: matplotlib writes {', '.join(sorted(kinds))}; name the file "
                             "with one of those endings (FILE.png)")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            try:
                Path(path).resolve().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"{flag} {path}: cannot make its folder: {exc.strerror or exc}") from None


def _systems_asked(args: argparse.Namespace, reranker: Any) -> dict[str, tuple[str, dict[str, Any], Any]]:
    """Each system the command line asks for, by its label: (retriever name, options, reranker or None)."""
    asked = {}
    for system, (name, options) in system_options(args).items():
        stages = [None, reranker] if reranker is not None and args.with_first_stage else [reranker]
        for second in stages:
            label = f"{system}+{second.name}@{second.depth}" if second is not None else system
            asked[label] = (name, options, second)
    return asked


def _evaluated(args: argparse.Namespace, sets: list, asked: dict[str, tuple[str, dict[str, Any], Any]]):
    """Each system's report, as it finishes."""
    from ..eval import evaluate

    for label, (name, options, second) in asked.items():
        yield evaluate(sets, _factory(name, options, second, args.fast_queries), k=args.k, split=args.split,
                       pooled=args.pooled, name=label, progress=not args.quiet, max_queries=args.max_queries,
                       also_at=[int(c) for c in args.also_k.split(",") if c.strip()])


def _report(reports: list, args: argparse.Namespace, asked: list[str], interrupted: bool = False) -> None:
    """The warnings, the table and the comparisons; --json and --plot. `asked`: the labels of the systems the
    command line asked for: the JSON's layout is theirs (one system, or `systems` and `comparisons`), however
    many finished. `interrupted`: the JSON says the run stopped before its last systems, and which."""
    from ..eval import format_table, plot_reports

    for line in dict.fromkeys(w for r in reports for w in r.warnings):  # every system skips the same queries
        print(f"warning: {line}", file=sys.stderr)
    print(format_table(reports, per_category=args.per_category))
    comparisons = _compare(reports, args)
    if args.json:
        # per query: what the comparisons were computed from, so that a reader can redo or slice them
        systems = {r.name: r.to_json(per_category=args.per_category, per_query=True) for r in reports}
        data = systems[reports[0].name] if len(asked) == 1 else {"systems": systems, "comparisons": comparisons}
        if interrupted:
            left = [label for label in asked if label not in systems]
            data["interrupted"] = ("stopped (Ctrl-C) before every system was evaluated; these are the ones that "
                                   f"finished (not evaluated: {', '.join(left)})")
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_reports(reports, args.plot, metric=f"ndcg@{args.k}")
        print(f"plot written to {args.plot}", file=sys.stderr)


def system_options(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each system to evaluate, by its label (`retriever_systems`): its retriever and constructor options,
    exactly as `toolscout index` would build it; an encoder several sets (or retrievers) share is loaded once."""
    asked = retriever_systems(args)
    names = list(dict.fromkeys(name for _label, name, _settings in asked))
    models = {name: model_for(args.model, name) for name in names}
    if args.model and not any(models.values()):
        from ..models import model_config

        trained = model_config(args.model)
        if trained is None:  # an encoder's name or folder, and no retriever given takes one
            raise ValueError(f"--model {args.model}: none of --retriever {', '.join(names)} takes a model")
        method = trained[1].get("method")
        raise ValueError(f"--model {args.model} is a {method!r} model; evaluate it with "
                         f"{flags_for_model(args.model, method)}")
    for name in names:
        check_trained_model(name, models[name] or args.model)
    encoders: dict[str | None, Any] = {}
    systems = {}
    for label, name, settings in asked:
        from ..retrievers.base import check_settings, retriever_class

        options = {**retriever_options(args, name, models[name]), **settings}
        check_settings(f"--retriever {label}: the {name} retriever", retriever_class(name).__init__, options)
        options["intents"] = intents_from_args(args)
        if retriever_class(name).accepts.encoder:
            from ..retrievers.dense import encoder_for

            model = options.pop("model", None)
            if model not in encoders:
                # a name, a folder, or a `toolscout train embed` directory
                encoders[model] = encoder_for(model, backend=getattr(args, "encoder_backend", "auto"))
            options["encoder"] = encoders[model]
        systems[label] = (name, options)
    return systems


def _factory(name: str, options: dict[str, Any], reranker: Any, fast_queries: str | None = None):
    def build(tools):
        from ..pipeline import ToolScout
        from ..retrievers.base import forget_task_vectors

        scout = ToolScout.from_tools(tools, retriever=name, reranker=reranker, **options)
        if fast_queries:
            scout.use_fast_queries(fast_queries)
        # the encoder is shared by every system and set (loaded once), its query cache is not: each is timed cold
        forget_task_vectors(scout.retriever)
        return scout

    return build


def _resamples(text: str) -> int:
    """--bootstrap, checked before any set is evaluated (0 turns the comparison off)."""
    from ..eval.significance import MIN_RESAMPLES

    value = number_in(int, 0)(text)
    if 0 < value < MIN_RESAMPLES:
        raise argparse.ArgumentTypeError(
            f"a 95% interval needs at least {MIN_RESAMPLES} resamples (0: no comparison), got {value}: with fewer, "
            "each 2.5% tail of the interval holds less than one resample and no two-sided p can fall below 0.05")
    return value


def _compare(reports: list, args: argparse.Namespace) -> list[dict[str, Any]]:
    from ..eval import paired_bootstrap
    from ..eval.significance import fell_back

    comparisons = []
    if args.bootstrap == 0:
        return comparisons
    first = reports[0]
    for other in reports[1:]:
        result = paired_bootstrap(first, other, metric=f"ndcg@{args.k}", n_resamples=args.bootstrap)
        comparison = {"a": first.name, "b": other.name, **result.to_dict()}
        fell = fell_back(first, other)
        flag = f"; {fell} of them fell back to the first stage (a stage failed), so B is partly A there" if fell else ""
        print(f"{other.name} vs {first.name}: {result.line(_pooled(result, first) + flag)}")
        if fell:  # the same test on the queries both systems ranked as named (docs: README, "Evaluation")
            comparison["degraded_queries"] = fell
            comparison["fully_ranked"] = _compare_fully_ranked(first, other, args, fell == result.n_queries)
        comparisons.append(comparison)
    return comparisons


def _pooled(result: Any, first: Any) -> str:
    """What a comparison was computed over: the test pools queries (each weighs the same), while the table's
    mean row weighs each set the same."""
    from ..eval.report import counted

    return f"pooled over {result.n_queries} queries of {counted(len(first.sets), 'set')}"


def _compare_fully_ranked(first: Any, other: Any, args: argparse.Namespace, none_left: bool) -> dict[str, Any] | None:
    """The comparison on the queries no stage of either system failed on, printed; None when there are none."""
    from ..eval import paired_bootstrap

    label = f"{other.name} vs {first.name}, fully ranked queries only"
    if none_left:
        print(f"{label}: none (a stage failed on every query)")
        return None
    result = paired_bootstrap(first, other, metric=f"ndcg@{args.k}", n_resamples=args.bootstrap, fully_ranked=True)
    print(f"{label}: {result.line(_pooled(result, first))}")
    return result.to_dict()

"""ToolCLIP ablations (the ToolCLIP paper, Table 7) on one benchmark set: train each variant on the set's train
split, evaluate on its test split, print one table (a script, not a test).

    python benchmarks/toolclip_ablation.py [--data ../shared/data/rotbench] [--max-steps 30]
        [--variants full,shared,random,single] [--baselines dense,untrained] [--out-dir /tmp/toolclip-ablation]
        [--batch-size 32] [--eval-every N] [--max-queries N] [-o KEY=VALUE ...] [--json FILE]

Variants (everything else identical: same seed, data order, steps, schedule and lengths):

    full      separate towers, mined hard negatives in stage 2, multi-positive loss (the default model)
    shared    one transformer + projection for tasks and tools          (Table 7: shared vs separate)
    random    stage-2 extra negatives drawn at random from the catalog  (Table 7: random vs hard)
    single    single-positive loss over (task, gold tool) pairs         (Table 7: single vs multi)

Baselines (no training): `dense` is the plain dense retriever (all-MiniLM-L6-v2 over the text view);
`untrained` is ToolCLIP at initialisation (both towers = all-MiniLM-L6-v2, mean-pooling-equivalent heads).

Each trained model is written to OUT_DIR/VARIANT (re-running resumes an interrupted variant from its
checkpoint, and skips a finished one unless --retrain). Metrics are in points at k=10 on the test split,
the validation nDCG@10 is on queries carved from the train split. `-o KEY=VALUE` sets any
`toolscout.train.toolclip.ToolCLIPOptions` field for every variant (e.g. `-o train_layers=3`).

CPU: run it niced, e.g. `OMP_NUM_THREADS=1 nice -n 10 python benchmarks/toolclip_ablation.py ...`;
`--max-steps` bounds the time per variant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_DATA, machine_line, write_json  # noqa: E402

VARIANTS = {
    "full": {},
    "shared": {"shared_towers": True},
    "random": {"negatives": "random"},
    "single": {"multi_positive": False},
}
BASELINES = ("dense", "untrained")
METRICS = ("ndcg@10", "recall@10", "completeness@10")


def parse_options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"-o {pair!r}: expected KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def evaluate_system(bench, factory, name: str, max_queries: int | None):
    """(metrics row, EvalReport) of one system on the test split."""
    from toolscout.eval import evaluate

    report = evaluate([bench], factory, k=10, split="test", name=name, progress=False, max_queries=max_queries)
    metrics = report.sets[bench.name].metrics
    latency = sorted(report.latency_ms)
    row = {**{m: metrics[m] for m in METRICS}, "queries": report.sets[bench.name].n_queries,
           "index_s": round(report.build_s, 1), "p50_ms": latency[len(latency) // 2] if latency else None}
    return row, report


def significance(reports: dict) -> list[str]:
    """Paired bootstrap on nDCG@10: every system against dense, and `full` against each ablation."""
    from toolscout.eval import paired_bootstrap

    lines = []
    for name, report in reports.items():
        if name != "dense" and "dense" in reports:
            lines.append(f"{name} vs dense: {paired_bootstrap(reports['dense'], report)}")
        if name in VARIANTS and name != "full" and "full" in reports:
            lines.append(f"full vs {name}: {paired_bootstrap(report, reports['full'])}")
    return lines


def train_variant(name: str, data, out: Path, args, options: dict) -> dict:
    from toolscout.models import model_config
    from toolscout.train import TrainConfig
    from toolscout.train.toolclip import fit_toolclip

    found = model_config(out, method="toolclip") if out.exists() else None
    if found is not None and not args.retrain:
        summary = found[1]["summary"]
        print(f"[{name}] already trained in {out}; reusing it (--retrain to train again)", flush=True)
        return summary
    config = TrainConfig(batch_size=args.batch_size, max_steps=args.max_steps, epochs=args.epochs, seed=args.seed,
                         eval_every=args.eval_every, lr=args.lr, progress=not args.quiet)
    print(f"[{name}] training with {options or 'the defaults'}", flush=True)
    summary = fit_toolclip(data, out, config=config, **options)
    return summary.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA / "rotbench"), help="benchmark folder (train + test split)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma list of {', '.join(BASELINES)} (or '' for none)")
    parser.add_argument("--out-dir", default="/tmp/toolclip-ablation", help="where the trained models go")
    parser.add_argument("--max-steps", type=int, default=30, help="optimiser steps per variant")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--eval-every", type=int, default=None, help="validate every N steps (default: at the end)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-queries", type=int, default=None, help="evaluate at most N test queries")
    parser.add_argument("--retrain", action="store_true", help="train variants again even if their model exists")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="a ToolCLIPOptions field for every variant")
    parser.add_argument("--json", default=None, help="write the results as JSON")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.pipeline import ToolScout
    from toolscout.train import load_training_data

    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    baselines = [b for b in args.baselines.split(",") if b]
    unknown += [b for b in baselines if b not in BASELINES]
    if unknown:
        raise SystemExit(f"unknown variant(s)/baseline(s) {unknown}; variants: {', '.join(VARIANTS)}; "
                         f"baselines: {', '.join(BASELINES)}")
    common = parse_options(args.option)
    bench = load_benchmark(args.data)
    data = load_training_data([bench])
    print(f"{bench.name}: {len(data.train)} train / {len(data.validation)} validation / "
          f"{len(bench.split('test'))} test queries, {len(bench.tools)} tools; {machine_line()}", flush=True)

    def factory(retriever: str, **options):
        return lambda tools: ToolScout.from_tools(tools, retriever=retriever, **options)

    rows, reports = {}, {}
    for name in baselines:
        start = time.perf_counter()
        system = factory("toolclip", model=None) if name == "untrained" else factory("dense")
        rows[name], reports[name] = evaluate_system(bench, system, name, args.max_queries)
        rows[name]["wall_s"] = round(time.perf_counter() - start, 1)
        print(f"[{name}] {rows[name]}", flush=True)
    out_dir = Path(args.out_dir) / bench.name
    for name in variants:
        out = out_dir / name
        start = time.perf_counter()
        summary = train_variant(name, data, out, args, {**common, **VARIANTS[name]})
        train_wall = time.perf_counter() - start
        result, reports[name] = evaluate_system(bench, factory("toolclip", model=str(out)), name, args.max_queries)
        result.update(train_s=summary.get("time_s"), steps=summary.get("steps"),
                      examples_per_s=summary.get("examples_per_s"), validation_ndcg=summary.get("best_validation"),
                      train_wall_s=round(train_wall, 1))
        rows[name] = result
        print(f"[{name}] {result}", flush=True)

    print_table(bench.name, rows, args)
    tests = significance(reports)
    print("\n".join(["", "paired bootstrap (B − A, nDCG@10, test split):", *tests]) if tests else "")
    write_json(args.json, {"set": bench.name, "args": vars(args), "options": common, "results": rows,
                           "significance": tests, "machine": machine_line()})
    return 0


def print_table(set_name: str, rows: dict, args) -> None:
    header = (f"{'system':<12}{'nDCG@10':>9}{'R@10':>8}{'Comp@10':>9}{'val nDCG':>10}{'steps':>7}{'train s':>9}"
              f"{'ex/s':>7}{'p50 ms':>8}")
    print(f"\nToolCLIP ablation on {set_name} (test split, k=10; max_steps={args.max_steps}, batch={args.batch_size})")
    print(header)
    print("-" * len(header))

    def fmt(value, spec):
        if isinstance(value, (int, float)):
            return format(value, spec)
        return "-".rjust(int(spec[1:].split(".")[0].rstrip("df")))

    for name, r in rows.items():
        print(f"{name:<12}{fmt(r['ndcg@10'], '>9.2f')}{fmt(r['recall@10'], '>8.2f')}"
              f"{fmt(r['completeness@10'], '>9.2f')}"
              f"{fmt(r.get('validation_ndcg'), '>10.2f')}{fmt(r.get('steps'), '>7d')}{fmt(r.get('train_s'), '>9.0f')}"
              f"{fmt(r.get('examples_per_s'), '>7.2f')}{fmt(r.get('p50_ms'), '>8.1f')}")


if __name__ == "__main__":
    sys.exit(main())

"""`toolscout learn DIR [LOG.jsonl...]`: tool-use feedback from log files, taking a source back, and the
opt-in heavier learning (`--train mlc|refiner|embed`), on an index that no server holds at the moment
(a running server takes the same through POST /feedback, DELETE /feedback and POST /admin/learn)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from .options import parse_options

BATCH = 1000


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learn", help="learn from tool-use feedback: import logs, take a source back, retrain",
                       description="Import tool-use feedback (JSONL, one {query, tool_ids, source?, outcome?} per "
                                   "line) into an index, which learns from it at once; take back what a source "
                                   "taught; or train a heavier model on the feedback so far and keep it only if "
                                   "held-back feedback ranks better.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="pipeline directory (optional with --store); no server may be serving it")
    p.add_argument("logs", metavar="LOG", nargs="*", help="feedback logs (JSONL) to import")
    p.add_argument("--store", default=None, metavar="DSN", help="the PostgreSQL index at DSN instead of DIR")
    p.add_argument("--source", default="import", help="source of events that name none (default %(default)s)")
    p.add_argument("--forget", action="append", default=[], metavar="SOURCE",
                   help="take back everything SOURCE taught (repeatable)")
    p.add_argument("--train", choices=["mlc", "refiner", "embed"], default=None,
                   help="train this on the feedback so far; swapped in only when held-back feedback ranks better")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the --train trainer, VALUE parsed as JSON when it can be (repeatable)")
    p.set_defaults(handler=cmd_learn)


def cmd_learn(args: argparse.Namespace) -> int:
    from ..feedback import DEFAULT_SOURCE, events_from_jsonl
    from ..postgres import recorded_spec
    from ..serve.limits import FeedbackLimits
    from ..serve.service import ToolService

    if not (args.logs or args.forget or args.train):
        raise ValueError("nothing to do: give feedback logs, --forget SOURCE or --train METHOD")
    target = args.store or recorded_spec(args.dir) or args.dir
    if target is None:
        raise ValueError("give the pipeline directory (DIR) or --store postgresql://...")
    events = [replace(e, source=args.source) if e.source == DEFAULT_SOURCE else e
              for log in args.logs for e in events_from_jsonl(log)]  # every log is read before anything changes
    service = ToolService.open(target, batch_workers=0, limits=FeedbackLimits(rate=None, volume=None))
    try:
        if events:
            _import(service, events)
        for source in args.forget:
            print(f"forgot source {source!r}: {len(service.forget(source))} tools as before", file=sys.stderr)
        if args.train:
            state = service.retrain(args.train, **parse_options(args.option))
            verdict = "swapped in" if state["state"] == "swapped" else "kept the pipeline as it was"
            print(f"{args.train}: held-back nDCG@10 {state['candidate_ndcg@10']:.2f} vs {state['baseline_ndcg@10']:.2f} "
                  f"({state['train_queries']} requests trained on, {state['holdout_queries']} held back): {verdict}",
                  file=sys.stderr)
    finally:
        service.close()
    return 0


def _import(service, events) -> None:
    from tqdm.auto import tqdm

    totals = {"learned": 0, "duplicates": 0, "capped": 0, "failures": 0, "unknown": 0}
    with tqdm(total=len(events), unit="event", desc="feedback", disable=None) as bar:
        for start in range(0, len(events), BATCH):
            result = service.feedback(events[start:start + BATCH])
            for key, value in (("learned", len(result.learned)), ("duplicates", result.duplicates),
                               ("capped", result.capped), ("failures", result.failures),
                               ("unknown", len(result.unknown))):
                totals[key] += value
            bar.update(result.events)
    print(f"{len(events)} events: {totals['learned']} (tool, request) pairs learned, {totals['duplicates']} repeats, "
          f"{totals['capped']} over the per-source cap, {totals['failures']} failures, {totals['unknown']} unknown "
          "tool ids", file=sys.stderr)

"""Tasks given as chat transcripts: how search reads them (`toolscout.conversation`), measured two ways.

- validation: transcripts built from the train splits of four dev sets. Each task is one train request
  with 0, 3 or 8 requests of other tools of its set before it as earlier turns (each answered by the
  same short reply), and a variant where a follow-up turn that names nothing comes after it. The gold
  tools are the last request's. This is where `EARLIER_TURN_DECAY` and `RECENT_CHARS` were chosen.
- check: apibank's test dialogues as they are (real multi-turn transcripts; no train task is one), split
  by how many speaker turns they have.

Each is ranked two ways: "recent turns first" (toolscout's reading) and "every turn alike" (BM25 counting
every turn's words once and the latest turn's twice, the encoder reading the transcript from its first
turn: toolscout's reading before this one, except that BM25 then also counted the speaker labels' words).

    python benchmarks/transcripts.py --data ../shared/data --json out.json
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from common import DEFAULT_DATA, machine_line, write_json

VALIDATION_SETS = ("metatool", "rotbench", "sealtools", "toollens")
SYSTEMS = ("bm25", "dense", "default")
REPLY = "AI: Done, here is the result."
FOLLOW_UP = ("AI: Sure. Could you confirm the details first?", "User: Yes, go ahead with what I said.")


def transcript_tasks(bset, earlier: int, follow_up: bool, n: int, seed: str):
    """`n` train requests of `bset`, each after `earlier` requests of other tools (and a follow-up turn)."""
    from toolscout.benchmark_sets import Query

    rng = random.Random(seed)
    train = bset.split("train")
    targets = rng.sample(train, min(n, len(train)))
    out = []
    for task in targets:
        others = [q for q in train if not set(q.labels) & set(task.labels)]
        lines = [line for q in rng.sample(others, earlier) for line in (f"User: {q.text}", REPLY)]
        lines.append(f"User: {task.text}")
        if follow_up:
            lines += FOLLOW_UP
        text = "\n".join(lines) if len(lines) > 1 else task.text
        out.append(Query(task.id, text, task.labels, "test"))
    return out


def reading(recent: bool) -> None:
    """Switch toolscout's reading of transcripts: recent turns first (its own) or every turn alike."""
    from toolscout import conversation

    conversation.EARLIER_TURN_DECAY = DECAY if recent else 1.0
    conversation.RECENT_CHARS = RECENT if recent else conversation.FOCUS_CHARS


def system_factory(system: str, encoder, built: dict):
    """Builds `system` on a catalog once; both readings search the same index."""
    from toolscout.pipeline import ToolScout

    def build(tools):
        key = (system, tuple(t.id for t in tools))
        if key not in built:
            options = {"bm25": {"retriever": "bm25"}, "dense": {"retriever": "dense", "encoder": encoder},
                       "default": {"encoder": encoder}}[system]
            built[key] = ToolScout.from_tools(tools, **options)
        return built[key]
    return build


def measure(groups: dict, encoder) -> dict:
    """nDCG@10 of every system under both readings on each group of sets (name -> list of BenchmarkSet)."""
    from toolscout.eval import evaluate

    out: dict = {"tasks": {group: sum(len(s.queries) for s in sets) for group, sets in groups.items()}}
    for system in SYSTEMS:
        built: dict = {}
        for recent in (False, True):
            reading(recent)
            name = "recent" if recent else "alike"
            for group, sets in groups.items():
                report = evaluate(sets, system_factory(system, encoder, built), k=10, progress=False)
                ndcg = [report.sets[s.name].metrics["ndcg@10"] for s in sets]
                value = round(sum(ndcg) / len(ndcg), 2)
                out.setdefault(system, {}).setdefault(group, {})[name] = value
                print(f"{system:8s} {name:7s} {group:12s} nDCG@10 {value:6.2f}", flush=True)
    reading(True)
    return out


def validation_groups(data: Path, per_set: int) -> dict:
    from toolscout.benchmark_sets import BenchmarkSet, load_benchmark

    sets = [load_benchmark(data / name) for name in VALIDATION_SETS]
    groups = {}
    for earlier, follow_up in ((0, False), (3, False), (8, False), (3, True)):
        name = f"{'follow-up' if follow_up else 'earlier'}{earlier}"
        groups[name] = [BenchmarkSet(s.name, s.tools, transcript_tasks(s, earlier, follow_up, per_set,
                                                                      f"{s.name}/{earlier}/{follow_up}"))
                        for s in sets]
    return groups


def apibank_groups(data: Path) -> dict:
    from toolscout.benchmark_sets import BenchmarkSet, load_benchmark
    from toolscout.conversation import _TURN

    apibank = load_benchmark(data / "apibank")
    buckets = {"turns1": (0, 1), "turns2-4": (2, 4), "turns5-9": (5, 9), "turns10+": (10, 10 ** 6)}
    groups = {"all": [BenchmarkSet("apibank", apibank.tools, apibank.split("test"))]}
    for name, (low, high) in buckets.items():
        tasks = [q for q in apibank.split("test") if low <= len(_TURN.findall(q.text)) <= high]
        groups[name] = [BenchmarkSet("apibank", apibank.tools, tasks)]
    return groups


DECAY = RECENT = None  # toolscout's own values, read at start (`main`)


def main(argv=None) -> int:
    global DECAY, RECENT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--per-set", type=int, default=120, help="validation tasks per set and group (120)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from toolscout import conversation
    from toolscout.retrievers.dense import encoder_for

    DECAY, RECENT = conversation.EARLIER_TURN_DECAY, conversation.RECENT_CHARS
    print(machine_line())
    encoder = encoder_for(None)
    result = {"earlier_turn_decay": DECAY, "recent_chars": RECENT, "per_set": args.per_set,
              "validation": measure(validation_groups(args.data, args.per_set), encoder),
              "apibank": measure(apibank_groups(args.data), encoder)}
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

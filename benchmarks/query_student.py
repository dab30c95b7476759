"""The quality check a query student must pass before it serves as the "student" fast tier (`encoders/students.py`).

    python benchmarks/query_student.py --json runs/student.json        # the default encoder and its student
    python scripts/record_quality_check.py runs/student.json --model toolscout-tools-queries  # keep the verdict

Ranks every labelled dev set's test queries against its own catalog, in one run, with tasks encoded by the
teacher (its int8 encoding: what serves without a student) and by the student (int8), tools always by the
teacher. The check is the default pipeline's (what users get): it passes when macro nDCG@10 moves by less
than 0.3. For information it also ranks with the dense retriever alone, prints the zero-shot macro (bfcl
and gorilla_huggingface, which neither model was trained on), a paired bootstrap of the pipeline's
nDCG@10 over all queries and over the zero-shot ones, and the median time to encode one task each way.
The `--json` verdict carries the student's int8 embeddings of the export probe texts;
`scripts/record_quality_check.py` keeps it in the student's packaged manifest (a release step).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from common import DEFAULT_DATA, DEV_SETS, ZERO_SHOT, encode_ms, machine_line, print_check_table, write_json


def reports(encoder, folders: list[Path], system: str, max_queries: int | None, tasks_by=None):
    """The eval report of the default pipeline (`system="default"`) or the dense retriever alone, tools by
    `encoder`, tasks by `tasks_by` (None: the encoder)."""
    from toolscout.eval import evaluate
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.base import Encoding, parts

    options = {"retriever": "dense", "intents": None} if system == "dense" else {}

    def build(tools):
        scout = ToolScout.from_tools(tools, encoder=encoder, **options)
        for part in parts(scout.retriever):
            if isinstance(part, Encoding):
                part.query_encoder = tasks_by
        return scout

    return evaluate(folders, build, k=10, progress=False, max_queries=max_queries)


def ndcg(report) -> dict[str, float]:
    return {name: s.metrics["ndcg@10"] for name, s in report.sets.items()}


def bootstrap_line(label: str, result) -> dict:
    print(f"paired bootstrap, {label}: {result}")
    return {"delta": round(result.diff, 3), "ci": [round(result.ci_low, 3), round(result.ci_high, 3)],
            "p_two_sided": round(result.p_two_sided, 4), "queries": result.n_queries}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default=None, help="the teacher (default: the default encoder)")
    parser.add_argument("--student", default=None, help="packaged student name (default: the teacher's own)")
    parser.add_argument("--sets", default=",".join(DEV_SETS))
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.encoders import PROBE_TEXTS, Encoder
    from toolscout.encoders.packaged import assembled_from
    from toolscout.encoders.query_cache import QueryCache
    from toolscout.encoders.quality import verdict
    from toolscout.encoders.students import students_of
    from toolscout.eval import paired_bootstrap

    print(machine_line(), file=sys.stderr)
    teacher = Encoder.load(args.model)
    source = assembled_from(teacher.path)
    name = args.student or (students_of(source)[0][0] if source and students_of(source) else None)
    if name is None:
        parser.error(f"{teacher.name} ships no query student for its current weights; name one with --student")
    student = Encoder.load(name, backend="onnx-int8")  # before a check is recorded, auto would not pick int8
    print(f"teacher {teacher.name} ({teacher.backend_in_use}), student {name} ({student.backend_in_use})",
          file=sys.stderr, flush=True)
    folders = [args.data / s for s in args.sets.split(",") if s]
    runs = {(system, who): reports(teacher, folders, system, args.max_queries, tasks_by)
            for system in ("default", "dense") for who, tasks_by in (("teacher", None), ("student", student))}
    check = verdict(ndcg(runs["default", "teacher"]), ndcg(runs["default", "student"]),
                    probe_vectors=student.encode(list(PROBE_TEXTS)))
    check["dense"] = verdict(ndcg(runs["dense", "teacher"]), ndcg(runs["dense", "student"]))
    zero_shot = [s for s in ZERO_SHOT if s in check["per_set"]]
    if zero_shot:
        check["zero_shot_macro"] = {who: round(sum(check["per_set"][s][key] for s in zero_shot) / len(zero_shot), 3)
                                    for who, key in (("teacher", "exact"), ("student", "fast"))}
    print_check_table("default pipeline (the check): teacher's tasks | student's tasks", check)
    print_check_table("dense retriever (for information)", check["dense"])
    check["bootstrap"] = {"all": bootstrap_line("all queries", paired_bootstrap(runs["default", "teacher"],
                                                                               runs["default", "student"]))}
    if zero_shot:
        pair = [replace(runs["default", who], sets={s: runs["default", who].sets[s] for s in zero_shot})
                for who in ("teacher", "student")]
        check["bootstrap"]["zero_shot"] = bootstrap_line("zero-shot sets", paired_bootstrap(*pair))
    teacher.query_cache = student.query_cache = QueryCache(0)  # every task encoded
    tasks = [q.text for f in folders[:4] for q in load_benchmark(f).split("test")[:100]]
    check.update({"query_ms_teacher": round(encode_ms(teacher.encode_queries, tasks), 3),
                  "query_ms_student": round(encode_ms(student.encode_queries, tasks), 3),
                  "against": f"{teacher.name} ({teacher.backend_in_use}) tasks, default pipeline",
                  "sets": sorted(check["per_set"]), "command": "python benchmarks/query_student.py"})
    print(f"verdict: {'PASS' if check['passed'] else 'FAIL'} (|delta| < {check['tolerance']}); encoding one task "
          f"{check['query_ms_teacher']:.2f} -> {check['query_ms_student']:.2f} ms")
    write_json(args.json, check)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long descriptions: the default pipeline on real OpenAPI specs whose operations carry kilobytes of markdown,
with descriptions read as written and as plain text (`TextView.descriptions`; README, "text view").

The specs are GitHub's REST API (1,078 operations, long markdown descriptions) and Stripe's (short ones),
as the openapi-spec-validator 0.9.0 sdist ships them for its own benchmarks; `pip download` fetches it
once into --cache (or give --spec NAME=PATH). The tasks are ours (benchmarks/tasks/NAME_tasks.jsonl):
written and labelled from each spec's list of operations before any ranking was seen. None of this data
was used to train anything; the plain reading's cut (600 characters) and lead sentence were chosen on
these tasks and the dev sets' train queries, so neither figure is an unseen test.

    python benchmarks/long_descriptions.py --json out.json
    python benchmarks/long_descriptions.py --spec github=github.yaml --spec stripe=stripe.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import machine_line, write_json

PACKAGE = "openapi-spec-validator==0.9.0"
SPECS = {"github": "github.yaml", "stripe": "stripe.yaml"}  # NAME -> the file in the sdist's tests/bench/specs
TASKS = Path(__file__).resolve().parent / "tasks"
FORMS = ("as-written", "plain")


def fetch_specs(cache: Path) -> dict[str, Path]:
    """The specs, extracted from the package's sdist (downloaded into `cache` the first time)."""
    found = {name: cache / file for name, file in SPECS.items()}
    if all(path.exists() for path in found.values()):
        return found
    cache.mkdir(parents=True, exist_ok=True)
    sdists = sorted(cache.glob("openapi_spec_validator-*.tar.gz"))
    if not sdists:
        print(f"downloading the {PACKAGE} sdist into {cache}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", PACKAGE, "--no-binary", ":all:", "--no-deps",
                        "--quiet", "-d", str(cache)], check=True)
        sdists = sorted(cache.glob("openapi_spec_validator-*.tar.gz"))
    with tarfile.open(sdists[-1]) as archive:
        for name, file in SPECS.items():
            member = next(m for m in archive.getmembers() if m.name.endswith(f"tests/bench/specs/{file}"))
            found[name].write_bytes(archive.extractfile(member).read())
    return found


def task_set(name: str, spec: Path):
    from toolscout import load_tools
    from toolscout.benchmark_sets import BenchmarkSet, Query

    tools = load_tools(spec)
    rows = [json.loads(line) for line in (TASKS / f"{name}_tasks.jsonl").read_text().splitlines() if line.strip()]
    known = {t.id for t in tools}
    missing = sorted({label for row in rows for label in row["labels"]} - known)
    if missing:
        raise SystemExit(f"{TASKS / f'{name}_tasks.jsonl'}: labels not in {spec}: {', '.join(missing[:5])}")
    return BenchmarkSet(name, tools, [Query(r["id"], r["query"], tuple(r["labels"]), "test") for r in rows])


def measure(sets, system: str) -> dict:
    """nDCG@10 of `system` ("default" pipeline or "dense" alone) under each description form, and the
    paired bootstrap of plain against as-written, per set."""
    from toolscout.eval import evaluate, paired_bootstrap_per_set
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.dense import encoder_for
    from toolscout.tool import TextView

    encoder = encoder_for(None)
    options = {"retriever": "dense", "intents": None} if system == "dense" else {}
    reports = {form: evaluate(sets, lambda tools, form=form: ToolScout.from_tools(
        tools, encoder=encoder, view=TextView(descriptions=form), **options), k=10, progress=False)
        for form in FORMS}
    tests = paired_bootstrap_per_set(reports["as-written"], reports["plain"])
    out = {}
    for s in sets:
        before, after = (reports[f].sets[s.name].metrics["ndcg@10"] for f in FORMS)
        test = tests[s.name]
        out[s.name] = {"tools": len(s.tools), "tasks": len(s.queries), "as-written": round(before, 2),
                       "plain": round(after, 2), "delta": round(test.diff, 2),
                       "ci_low": round(test.ci_low, 2), "ci_high": round(test.ci_high, 2),
                       "p_two_sided": round(test.p_two_sided, 4)}
        print(f"{system:8s} {s.name:8s} {len(s.tools):5d} tools {len(s.queries):3d} tasks  nDCG@10 as written "
              f"{before:6.2f}  plain {after:6.2f}  ({test.line('paired bootstrap')})")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", action="append", default=[], metavar="NAME=PATH",
                        help=f"a spec file instead of the downloaded one ({', '.join(SPECS)})")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "toolscout-openapi-specs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    given = dict(item.split("=", 1) for item in args.spec)
    unknown = sorted(set(given) - set(SPECS))
    if unknown:
        parser.error(f"--spec: unknown spec {', '.join(unknown)}; known: {', '.join(SPECS)}")
    specs = {name: Path(path) for name, path in given.items()}
    if len(specs) < len(SPECS):
        specs = {**fetch_specs(args.cache), **specs}
    sets = [task_set(name, specs[name]) for name in SPECS]
    print(machine_line())
    result = {"package": PACKAGE, "systems": {system: measure(sets, system) for system in ("default", "dense")}}
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Keep a quality check's verdict with the model it checked: a release step, which writes package data.

    python benchmarks/quantization.py --json runs/int8.json
    python scripts/record_quality_check.py runs/int8.json                       # the default encoder
    python scripts/record_quality_check.py runs/int8.json --model DIR_OR_NAME

    python benchmarks/query_student.py --json runs/student.json
    python scripts/record_quality_check.py runs/student.json --model toolscout-tools-queries

The benchmarks only measure (`--json` writes the verdict, probe vectors included); this writes it where
`backend="auto"` reads it (`toolscout.encoders.quality.record`): a packaged model's manifest in the source
tree, so the wheel carries it, or `toolscout-quality.json` in a model folder. A verdict that is not a
passed-or-failed check with probe vectors is refused, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def target_of(model: str | None) -> Path:
    """A packaged model's source folder, or the model folder a name or path resolves to."""
    from toolscout.encoders import resolve_model
    from toolscout.encoders.packaged import packaged_models
    from toolscout.encoders.resolve import default_encoder_name

    name = model or default_encoder_name()
    return packaged_models().get(name) or Path(resolve_model(name))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verdict", type=Path, help="the --json file of benchmarks/quantization.py or query_student.py")
    parser.add_argument("--model", default=None, help="the model it checked (default: the default encoder)")
    args = parser.parse_args(argv)

    from toolscout.encoders.quality import record

    try:
        check = json.loads(args.verdict.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        parser.error(f"{args.verdict}: {exc}")
    missing = [key for key in ("passed", "per_set", "probe_vectors") if key not in check]
    if missing:
        parser.error(f"{args.verdict}: not a quality check's verdict (no {', '.join(missing)}); "
                     "write one with the benchmark's --json")
    print(f"recorded in {record(target_of(args.model), check)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

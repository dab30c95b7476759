"""Reproduce the published figures: one conditions file, one runner, the docs' tables made from it.

    python benchmarks/reproduce.py list                       # every condition, its command and cost
    python benchmarks/reproduce.py run transcripts            # run conditions, compare with what is published
    python benchmarks/reproduce.py run transcripts --accept   # ... and publish what was measured
    python benchmarks/reproduce.py run ID --outputs DIR       # read the figures a run of ID's command wrote in DIR
    python benchmarks/reproduce.py docs                       # rewrite the tables from the conditions file
    python benchmarks/reproduce.py docs --check               # fail when a table differs from it

`benchmarks/conditions.yaml` holds, for each published figure: the system and data (`command`, run with
bash from the repository root), where the command writes the figure (`from`: a JSON file the command
writes under `{out}` and the path of the value in it, as a JSON pointer; `minus`: a second one
subtracted, for a published difference; `scale`: a factor, for other units), the figure published
(`expect`) and how far a re-run may land from it (`tolerance`, absolute, in the figure's units). `run`
exits 1 when a figure drifts beyond its tolerance.

A condition gives rows of tables (`rows`: each a `table` and its `cells`, formatted with the figures;
`table` and `cells` on the condition itself for one row). `docs` renders each table (`tables`: its file
and columns) from `expect` between its markers, `<!-- conditions:ID -->` and `<!-- /conditions:ID -->`,
so a figure is written in one place; a test (`tests/test_reproduce.py`) fails when a table and the file
disagree.

Placeholders in a command: `{data}` (the benchmark folders, `--data`), `{out}` (a fresh folder for this
condition's files), `{python}` and `{toolscout}` (this interpreter and its `toolscout` command); literal
braces are doubled. `--accept` writes the measured figures into the conditions file, each where its
`expect` stands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from common import DEFAULT_DATA

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ROOT / "benchmarks" / "conditions.yaml"
DEFAULT_TOLERANCE = 0.05


class ConditionsError(ValueError):
    """The conditions file is malformed (the message names the condition and field)."""


@dataclass
class Figure:
    name: str
    source: str  # "FILE.json:path/to/value" (JSON-pointer escapes: "~1" is "/", "~0" is "~")
    expect: float
    tolerance: float
    minus: str | None = None  # a second source, subtracted (a published difference)
    scale: float = 1.0  # published in other units than written (ms written, seconds published: 0.001)

    def read(self, out: Path) -> float:
        """The figure the command wrote under `out`."""
        value = self._value(out, self.source)
        value = value - self._value(out, self.minus) if self.minus else value
        return value * self.scale

    def _value(self, out: Path, source: str) -> float:
        file, _, path = source.partition(":")
        try:
            value: Any = json.loads((out / file).read_text(encoding="utf-8"))
        except OSError:
            raise ConditionsError(f"figure {self.name!r}: the command wrote no {file}") from None
        for key in [k.replace("~1", "/").replace("~0", "~") for k in path.split("/") if k]:
            if isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            elif isinstance(value, dict) and key in value:
                value = value[key]
            else:
                raise ConditionsError(f"figure {self.name!r}: {file} has no {path!r} (stopped at {key!r})")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConditionsError(f"figure {self.name!r}: {file}:{path} is {value!r}, not a number")
        return float(value)

    def drifted(self, measured: float) -> bool:
        return not math.isfinite(measured) or abs(measured - self.expect) > self.tolerance + 1e-9


@dataclass
class Row:
    table: str
    cells: list[str]


@dataclass
class Condition:
    id: str
    rows: list[Row]
    command: list[str]
    figures: list[Figure]
    minutes: float | None = None
    note: str = ""

    def row(self, row: Row) -> str:
        """A table row, its cells formatted with the published figures."""
        values = {f.name: f.expect for f in self.figures}
        try:
            return markdown_line([cell.format(**values) for cell in row.cells])
        except (KeyError, ValueError, IndexError) as exc:
            raise ConditionsError(f"condition {self.id!r}: a cell cannot be formatted ({exc!r})") from None


@dataclass
class Table:
    id: str
    file: str
    columns: list[str]


def load(path: Path = CONDITIONS) -> tuple[dict[str, Table], list[Condition]]:
    """The tables and conditions of `path`, checked: every error names the condition and field at fault."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConditionsError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list) \
            or not isinstance(data.get("conditions"), list):
        raise ConditionsError(f"{path}: needs a 'tables' list and a 'conditions' list")
    tables = {}
    for entry in data["tables"]:
        table = Table(str(_field(entry, "id", "table")), str(_field(entry, "file", "table")),
                      [str(c) for c in _field(entry, "columns", "table")])
        tables[table.id] = table
    conditions, seen = [], set()
    for entry in data["conditions"]:
        condition = _condition(entry, tables)
        if condition.id in seen:
            raise ConditionsError(f"condition {condition.id!r} is listed twice")
        seen.add(condition.id)
        conditions.append(condition)
    return tables, conditions


def _field(entry: Any, key: str, what: str) -> Any:
    if not isinstance(entry, dict) or key not in entry:
        name = entry.get("id") if isinstance(entry, dict) else entry
        raise ConditionsError(f"{what} {name!r}: missing field {key!r}")
    return entry[key]


def _condition(entry: Any, tables: dict[str, Table]) -> Condition:
    cid = str(_field(entry, "id", "condition"))
    rows = entry.get("rows") if "rows" in entry else [entry]  # one row: its table and cells on the condition
    if not isinstance(rows, list) or not rows:
        raise ConditionsError(f"condition {cid!r}: field 'rows' is a list of {{table, cells}}")
    command = _field(entry, "command", "condition")
    command = [command] if isinstance(command, str) else [str(line) for line in command]
    default = float(entry.get("tolerance", DEFAULT_TOLERANCE))
    figures = [_figure(cid, str(name), spec, default)
               for name, spec in (_field(entry, "figures", "condition") or {}).items()]
    return Condition(cid, [_row(cid, row, tables) for row in rows], command, figures, entry.get("minutes"),
                     str(entry.get("note", "")))


def _row(cid: str, entry: Any, tables: dict[str, Table]) -> Row:
    if not isinstance(entry, dict) or "table" not in entry or "cells" not in entry:
        raise ConditionsError(f"condition {cid!r}: a row needs fields 'table' and 'cells'")
    table, cells = str(entry["table"]), [str(c) for c in entry["cells"]]
    if table not in tables:
        raise ConditionsError(f"condition {cid!r}: field 'table' names {table!r}, not one of {sorted(tables)}")
    if len(cells) != len(tables[table].columns):
        raise ConditionsError(f"condition {cid!r}: field 'cells' has {len(cells)} cells, table {table!r} "
                              f"{len(tables[table].columns)} columns")
    return Row(table, cells)


def _figure(cid: str, name: str, spec: Any, default: float) -> Figure:
    if not isinstance(spec, dict) or "from" not in spec or "expect" not in spec:
        raise ConditionsError(f"condition {cid!r}: figure {name!r} needs 'from' and 'expect'")
    if any(":" not in str(spec[key]) for key in ("from", "minus") if key in spec):
        raise ConditionsError(f"condition {cid!r}: figure {name!r}: 'from' and 'minus' are FILE.json:path/to/value")
    try:
        return Figure(name, str(spec["from"]), float(spec["expect"]), float(spec.get("tolerance", default)),
                      spec.get("minus"), float(spec.get("scale", 1.0)))
    except (TypeError, ValueError):
        raise ConditionsError(f"condition {cid!r}: figure {name!r}: 'expect', 'tolerance' and 'scale' "
                              "are numbers") from None


# ------------------------------------------------------------------------------------------ docs

def markdown_line(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def render(table: Table, conditions: list[Condition]) -> str:
    lines = [markdown_line(table.columns), "|" + "---|" * len(table.columns)]
    lines += [c.row(row) for c in conditions for row in c.rows if row.table == table.id]
    return "\n".join(lines)


def write_docs(tables: dict[str, Table], conditions: list[Condition], *, check: bool) -> list[str]:
    """Put each table between its markers; with `check`, change nothing and return what differs."""
    differ = []
    for table in tables.values():
        path = ROOT / table.file
        text = path.read_text(encoding="utf-8")
        start, end = f"<!-- conditions:{table.id} -->", f"<!-- /conditions:{table.id} -->"
        pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise ConditionsError(f"{table.file}: no {start} ... {end} markers for table {table.id!r}")
        new = pattern.sub(lambda _m: f"{start}\n{render(table, conditions)}\n{end}", text, count=1)
        if new != text:
            differ.append(f"{table.file}: table {table.id!r}")
            if not check:
                path.write_text(new, encoding="utf-8")
    return differ


# ------------------------------------------------------------------------------------------- run

def command_line(condition: Condition, data: Path, out: Path) -> str:
    toolscout = Path(sys.executable).with_name("toolscout")
    values = {"data": shlex.quote(str(data)), "out": shlex.quote(str(out)), "python": shlex.quote(sys.executable),
              "toolscout": shlex.quote(str(toolscout))}
    try:
        return "\n".join(line.format(**values) for line in condition.command)
    except (KeyError, IndexError) as exc:
        raise ConditionsError(f"condition {condition.id!r}: unknown placeholder {exc} in 'command'") from None


def run(condition: Condition, data: Path, keep: Path | None) -> dict[str, float]:
    """Run the condition's command; the figures it wrote. Raises on a failed command."""
    out = Path(tempfile.mkdtemp(prefix=f"reproduce-{condition.id}-", dir=keep))
    script = "set -euo pipefail\n" + command_line(condition, data, out)
    print(f"== {condition.id}: {' && '.join(condition.command)}", flush=True)
    started = time.time()
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise ConditionsError(f"condition {condition.id!r}: the command exited with {done.returncode}")
    print(f"   ran in {time.time() - started:.0f} s; files in {out}", flush=True)
    return {figure.name: figure.read(out) for figure in condition.figures}


def report(condition: Condition, measured: dict[str, float]) -> bool:
    """Print published against measured; True when nothing drifted."""
    fine = True
    for figure in condition.figures:
        value = measured[figure.name]
        drift = figure.drifted(value)
        fine &= not drift
        print(f"   {figure.name:<24} published {figure.expect:>10g}  measured {value:>10.4g}  "
              f"(±{figure.tolerance:g}){'  DRIFT' if drift else ''}")
    return fine


def accept(path: Path, measured: dict[str, dict[str, float]]) -> None:
    """Publish the measured figures: each `expect` number is replaced where it is written, so the file keeps
    its layout and comments; the result must read as the old file with only those numbers changed."""
    text = path.read_text(encoding="utf-8")
    wanted = yaml.safe_load(text)
    by_id = {entry["id"]: entry for entry in wanted["conditions"]}
    for cid, figures in measured.items():
        for name, value in figures.items():
            by_id[cid]["figures"][name]["expect"] = round(value, 4)
            text = _with_expect(text, cid, name, round(value, 4), path)
    if yaml.safe_load(text) != wanted:
        raise SystemExit(f"{path}: the measured figures could not be written in place; set `expect` by hand")
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _with_expect(text: str, cid: str, name: str, value: float, path: Path) -> str:
    """`text` with the `expect` scalar of figure `name` of condition `cid` replaced by `value`, found through
    the YAML node tree (which knows where each scalar stands in the text)."""
    def child(node: Any, key: str) -> Any:
        if isinstance(node, yaml.MappingNode):
            return next((v for k, v in node.value if k.value == key), None)
        return None

    conditions = child(yaml.compose(text), "conditions")
    entry = next((c for c in conditions.value if getattr(child(c, "id"), "value", None) == cid), None)
    number = child(child(child(entry, "figures"), name), "expect")
    if not isinstance(number, yaml.ScalarNode):
        raise SystemExit(f"{path}: condition {cid!r}, figure {name!r}: no `expect` to replace")
    return text[:number.start_mark.index] + repr(float(value)) + text[number.end_mark.index:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conditions", type=Path, default=CONDITIONS)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every condition, its command and its cost")
    run_p = sub.add_parser("run", help="run conditions and compare their figures with the published ones")
    run_p.add_argument("ids", nargs="*", help="condition ids (default: all; `list` shows them)")
    run_p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the benchmark folders (../shared/data)")
    run_p.add_argument("--keep", type=Path, default=None, help="keep each condition's files under this folder")
    run_p.add_argument("--accept", action="store_true", help="publish the measured figures, then rewrite the docs")
    run_p.add_argument("--outputs", type=Path, default=None, metavar="DIR",
                       help="one condition: read its figures from DIR, where an earlier run of its command (with "
                            "{out} = DIR) wrote them, instead of running it again")
    docs_p = sub.add_parser("docs", help="rewrite the docs' tables from the conditions file")
    docs_p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table differs")
    args = parser.parse_args(argv)
    try:
        tables, conditions = load(args.conditions)
        return ACTIONS[args.action](args, tables, conditions)
    except ConditionsError as exc:
        print(f"reproduce: {exc}", file=sys.stderr)
        return 2


def _list(args, tables, conditions) -> int:
    for c in conditions:
        cost = f"~{c.minutes:g} min" if c.minutes else "?"
        where = ", ".join(sorted({f"{tables[r.table].file}: {r.table}" for r in c.rows}))
        print(f"{c.id} [{where}] {cost}\n    " + "\n    ".join(c.command))
    return 0


def _run(args, tables, conditions) -> int:
    chosen = conditions if not args.ids else [c for c in conditions if c.id in args.ids]
    unknown = sorted(set(args.ids) - {c.id for c in conditions})
    if unknown:
        raise ConditionsError(f"no condition {', '.join(unknown)}; `list` shows them")
    if not (args.data / "README.md").exists() and not any(args.data.glob("*/tools.jsonl")):
        raise ConditionsError(f"no benchmark folders under {args.data}; pass --data DIR")
    if args.outputs is not None and len(chosen) != 1:
        raise ConditionsError("--outputs reads one condition's files: name exactly one condition")
    if args.keep is not None:  # made before the first command runs, not found missing after it
        try:
            args.keep.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConditionsError(f"--keep {args.keep}: cannot make that folder: {exc.strerror or exc}") from None
    measured, fine = {}, True
    for condition in chosen:
        if args.outputs is not None:
            print(f"== {condition.id}: figures read from {args.outputs} (written by: {' && '.join(condition.command)})")
            measured[condition.id] = {figure.name: figure.read(args.outputs) for figure in condition.figures}
        else:
            measured[condition.id] = run(condition, args.data, args.keep)
        fine &= report(condition, measured[condition.id])
    if args.accept:
        accept(args.conditions, measured)
        write_docs(*load(args.conditions), check=False)
        print(f"published in {args.conditions} and the docs")
        return 0
    print("every figure within its tolerance" if fine else "DRIFT: a figure moved beyond its tolerance")
    return 0 if fine else 1


def _docs(args, tables, conditions) -> int:
    differ = write_docs(tables, conditions, check=args.check)
    if args.check and differ:
        print("differs from the conditions file: " + "; ".join(differ)
              + " (python benchmarks/reproduce.py docs rewrites it)")
        return 1
    print("rewrote " + "; ".join(differ) if differ else "every table matches the conditions file")
    return 0


ACTIONS = {"list": _list, "run": _run, "docs": _docs}

if __name__ == "__main__":
    sys.exit(main())

"""The figures runner (benchmarks/reproduce.py): the README's table is what the conditions file says, a
re-run that lands off a published figure fails, and --accept publishes what was measured."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "reproduce.py"


def reproduce(*args):
    # the runner leaves each run's output folder in TMPDIR for people to read: here, one removed afterwards
    with tempfile.TemporaryDirectory(prefix="toolscout-reproduce-test-") as scratch:
        return subprocess.run([sys.executable, RUNNER, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "TMPDIR": scratch})


def test_the_readme_table_is_the_one_the_conditions_file_makes():
    done = reproduce("docs", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_published_figure_comes_from_a_file_its_command_writes():
    conditions = yaml.safe_load((ROOT / "benchmarks" / "conditions.yaml").read_text())["conditions"]
    for condition in conditions:
        command = condition["command"] if isinstance(condition["command"], list) else [condition["command"]]
        written = [re.compile(re.escape(name).replace(re.escape("$s"), "[a-z_]+") + "$")
                   for name in re.findall(r"\{out\}/([\w$.-]+\.json)", "\n".join(command))]
        assert written and condition["figures"], condition["id"]
        for name, figure in condition["figures"].items():
            for source in (figure["from"], figure.get("minus")):
                if source:
                    assert any(p.match(source.split(":")[0]) for p in written), (condition["id"], name)


@pytest.fixture
def bench(tmp_path):
    """A conditions file whose one condition writes {"m": {"x": 41.26}} and publishes x in a doc table."""
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- conditions:t -->\nstale\n<!-- /conditions:t -->\noutro\n")
    conditions = tmp_path / "conditions.yaml"

    def write(expect, **figure):
        conditions.write_text(yaml.safe_dump({
            "tables": [{"id": "t", "file": str(doc), "columns": ["what", "result"]}],
            "conditions": [{"id": "c", "table": "t", "cells": ["a figure", "{x:.1f} points"],
                            "command": """{python} -c 'import json,sys; json.dump({{"m": {{"x": 41.26}}}}, """
                                       """open(sys.argv[1], "w"))' {out}/r.json""",  # literal braces doubled
                            "figures": {"x": {"from": "r.json:m/x", "expect": expect, **figure}}}]}))
        return conditions

    return write, doc


@pytest.fixture
def data(tmp_path):
    """A folder that looks like ../shared/data (the runner refuses one without benchmark folders)."""
    (tmp_path / "data" / "a_set").mkdir(parents=True)
    (tmp_path / "data" / "a_set" / "tools.jsonl").write_text("")
    return tmp_path / "data"


def test_a_figure_within_its_tolerance_passes_and_one_beyond_it_fails(bench, data):
    write, doc = bench
    done = reproduce("--conditions", write(41.3), "run", "--data", data)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every figure within its tolerance" in done.stdout
    done = reproduce("--conditions", write(41.4), "run", "--data", data)
    assert done.returncode == 1 and "DRIFT" in done.stdout
    assert reproduce("--conditions", write(41.4, tolerance=0.2), "run", "--data", data).returncode == 0


def test_keep_makes_its_folder_and_keeps_the_run_there(bench, data, tmp_path):
    write, _doc = bench
    keep = tmp_path / "not" / "yet"
    done = reproduce("--conditions", write(41.3), "run", "--data", data, "--keep", keep)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = keep.iterdir()
    assert run.name.startswith("reproduce-c-") and json.loads((run / "r.json").read_text()) == {"m": {"x": 41.26}}
    (tmp_path / "a_file").write_text("")
    done = reproduce("--conditions", write(41.3), "run", "--data", data, "--keep", tmp_path / "a_file" / "sub")
    assert done.returncode == 2 and f"--keep {tmp_path / 'a_file' / 'sub'}: cannot make that folder" in done.stderr
    assert "==" not in done.stdout  # refused before any command ran


def test_accept_publishes_the_measured_figure_and_rewrites_the_table(bench, data):
    write, doc = bench
    conditions = write(39.0)
    assert reproduce("--conditions", conditions, "docs", "--check").returncode == 1  # "stale" is not the table
    done = reproduce("--conditions", conditions, "run", "--data", data, "--accept")
    assert done.returncode == 0, done.stdout + done.stderr
    assert yaml.safe_load(conditions.read_text())["conditions"][0]["figures"]["x"]["expect"] == 41.26
    assert doc.read_text() == ("intro\n<!-- conditions:t -->\n| what | result |\n|---|---|\n"
                               "| a figure | 41.3 points |\n<!-- /conditions:t -->\noutro\n")
    assert reproduce("--conditions", conditions, "docs", "--check").returncode == 0


def test_a_malformed_condition_is_named_with_its_field(bench, data):
    write, _doc = bench
    conditions = write(41.3)
    spec = yaml.safe_load(conditions.read_text())
    spec["conditions"][0]["figures"]["x"]["from"] = "r.json:m/y"
    conditions.write_text(yaml.safe_dump(spec))
    written = conditions.read_text()
    done = reproduce("--conditions", conditions, "run", "--data", data, "--accept")
    assert done.returncode == 2 and "figure 'x': r.json has no 'm/y' (stopped at 'y')" in done.stderr
    assert conditions.read_text() == written  # a failed run publishes nothing
    spec["conditions"][0]["table"] = "nope"
    conditions.write_text(yaml.safe_dump(spec))
    done = reproduce("--conditions", conditions, "docs")
    assert done.returncode == 2 and "condition 'c': field 'table' names 'nope'" in done.stderr


def test_accept_changes_only_the_published_number_and_keeps_the_files_layout(bench, data):
    """--accept edits the hand-written file in place: comments, flow mappings and key order survive, and the
    only difference is the one number that was measured."""
    write, _doc = bench
    conditions = write(39.0)  # the fixture's file, then the same content as a person writes it
    spec = yaml.safe_load(conditions.read_text())
    table, condition = spec["tables"][0], spec["conditions"][0]
    by_hand = (f"# published figures\ntables:\n- {{id: t, file: '{table['file']}', columns: [what, result]}}\n"
               f"conditions:\n- id: c  # the one condition\n  table: t\n  cells: ['a figure', '{{x:.1f}} points']\n"
               f"  command: {json.dumps(condition['command'])}\n"
               f"  figures:\n    x: {{from: 'r.json:m/x', expect: 39.0}}  # measured 2026-11\n")
    conditions.write_text(by_hand)
    assert yaml.safe_load(by_hand) == spec
    done = reproduce("--conditions", conditions, "run", "--data", data, "--accept")
    assert done.returncode == 0, done.stdout + done.stderr
    assert conditions.read_text() == by_hand.replace("expect: 39.0}", "expect: 41.26}")

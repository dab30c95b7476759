"""benchmarks/learning_headroom.py's oracles, on hand-made tasks: which cells each one lifts, and what that scores.
(The script end to end needs ../shared/data and minutes; its figures are a condition of reproduce.py.)"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def headroom():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its siblings as `common` and `learning_safety`
    try:
        spec = importlib.util.spec_from_file_location("learning_headroom", BENCHMARKS / "learning_headroom.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_task_goes_to_the_cell_of_its_nearest_request_and_that_requests_tools_go_on_top(headroom):
    ids = ["a", "b", "c", "d", "e"]
    # the nearest request (0.83) taught d and c (a tie); b comes from a farther request and is not lifted
    cell, lifted = headroom._cell(ids, [("d", 0.83, 0.0), ("c", 0.83, 0.0), ("b", 0.5, 0.0)])
    assert cell == (8, 1)  # similarity bin 0.8-0.9; the best ranked of d, c is c, at rank 3: group 2-3
    assert lifted == ["d", "c", "a", "b", "e"]
    assert headroom._cell(ids, [("z", 0.95, 0.0)]) == ((9, 4), ["z"] + ids)  # not in the ranking: the last group
    assert headroom._cell(ids, []) == (None, ids)


def row(kind, cell, before, lifted):
    return {"kind": kind, "cell": cell, "before": before, "now": before, "lifted": lifted}


def test_the_safe_oracle_skips_a_cell_that_costs_an_untaught_task_and_the_free_one_takes_it(headroom):
    x, y = (7, 1), (5, 2)
    rows = [row("taught", x, 0.5, 1.0), row("untaught", x, 1.0, 0.8),  # x: +0.5 - 0.2 > 0, costs an untaught task
            row("taught", y, 0.0, 1 / math.log2(3)), row("taught", y, 1.0, 1.0),  # y: gains, costs nobody
            row("untaught", (3, 0), 1.0, 0.0),  # lifting loses: neither oracle lifts here
            row(None, None, 0.25, 0.25)]  # no taught request: neither group, counted in "all"
    out = headroom._oracles(rows)
    assert out["taught"]["before"] == pytest.approx(100 * (0.5 + 0.0 + 1.0) / 3, abs=0.01)
    assert out["taught"]["best cells"] == pytest.approx(100 * (1.0 + 1 / math.log2(3) + 1.0) / 3, abs=0.01)
    assert out["taught"]["safe cells"] == pytest.approx(100 * (0.5 + 1 / math.log2(3) + 1.0) / 3, abs=0.01)
    assert out["untaught"]["best cells"] == pytest.approx(100 * (0.8 + 1.0) / 2, abs=0.01)  # x lifted, (3, 0) not
    assert out["untaught"]["safe cells"] == pytest.approx(100 * (1.0 + 1.0) / 2, abs=0.01)
    assert out["all"]["tasks"] == 6
    assert out["all"]["safe cells"] == pytest.approx(100 * (0.5 + 1.0 + 1 / math.log2(3) + 1.0 + 1.0 + 0.25) / 6, abs=0.01)

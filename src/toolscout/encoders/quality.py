"""Faster encodings are used only when they were shown not to cost retrieval quality, and that showing is
kept with the model.

A faster way of encoding (today: dynamically quantised int8 weights, `backend="onnx-int8"`) changes the
vectors a little. Whether it changes *retrieval* is measured, not assumed: `benchmarks/quantization.py`
ranks every dev set's test queries with the exact (float32) encoder and with the faster one, in one run,
and the faster one passes when macro nDCG@10 moves by less than `TOLERANCE` points. The result is
recorded with the model (`record`): in a packaged model's manifest, or in `toolscout-quality.json` in a
model folder. `backend="auto"` uses int8 only for a model whose recorded check passed; any other model,
and a check that failed or is missing, stays on float32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QUALITY_FILE = "toolscout-quality.json"
PACKAGED_FILE = "toolscout-packaged.json"  # what `packaged.assemble` leaves in an assembled model folder
TOLERANCE = 0.3  # points of macro nDCG@10 on the dev test splits a faster encoding may move


def recorded(model_folder: str | Path, variant: str = "onnx-int8") -> dict[str, Any] | None:
    """The quality check recorded for `variant` of the model in `model_folder` (None: never checked)."""
    folder = Path(model_folder)
    if (folder / PACKAGED_FILE).is_file():  # an assembled packaged model: the check is in its manifest
        checks = json.loads((folder / PACKAGED_FILE).read_text())["manifest"].get("quality", {})
    elif (folder / QUALITY_FILE).is_file():
        checks = json.loads((folder / QUALITY_FILE).read_text())
    else:
        return None
    return checks.get(variant)


def approved(model_folder: str | Path, variant: str = "onnx-int8") -> bool:
    """True when `variant` passed the recorded check: |Δ macro nDCG@10| < TOLERANCE."""
    check = recorded(model_folder, variant)
    return bool(check) and bool(check.get("passed")) and abs(float(check.get("macro_delta", 1e9))) < TOLERANCE


def verdict(per_set_exact: dict[str, float], per_set_fast: dict[str, float]) -> dict[str, Any]:
    """The check's record from both encodings' nDCG@10 per set (the same sets and queries)."""
    sets = sorted(per_set_exact)
    exact = sum(per_set_exact[s] for s in sets) / len(sets)
    fast = sum(per_set_fast[s] for s in sets) / len(sets)
    return {"passed": abs(fast - exact) < TOLERANCE, "macro_exact": round(exact, 3), "macro_fast": round(fast, 3),
            "macro_delta": round(fast - exact, 3), "tolerance": TOLERANCE,
            "per_set": {s: {"exact": round(per_set_exact[s], 3), "fast": round(per_set_fast[s], 3)} for s in sets}}


def record(target: str | Path, check: dict[str, Any], variant: str = "onnx-int8") -> Path:
    """Keep `check` with the model: `target` is a packaged model's source folder (its manifest.json) or
    a model folder (its toolscout-quality.json). Returns the file written."""
    from .packaged import MANIFEST

    target = Path(target)
    if (target / MANIFEST).is_file():
        path = target / MANIFEST
        data = json.loads(path.read_text())
        data.setdefault("quality", {})[variant] = check
    else:
        path = target / QUALITY_FILE
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[variant] = check
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path

"""Faster encodings are used only when they were shown not to cost retrieval quality, and that showing is
kept with the model.

A faster way of encoding (today: dynamically quantised int8 weights, `backend="onnx-int8"`) changes the
vectors a little. Whether it changes *retrieval* is measured, not assumed: `benchmarks/quantization.py`
ranks every dev set's test queries with the exact (float32) encoder and with the faster one, in one run,
and the faster one passes when macro nDCG@10 moves by less than `TOLERANCE` points. The result is
recorded with the model (`record`): in a packaged model's manifest, or in `toolscout-quality.json` in a
model folder. `backend="auto"` uses int8 only for a model whose recorded check passed; any other model,
and a check that failed or is missing, stays on float32.

A check holds for the int8 vectors it measured, and int8 kernels differ between CPUs (AVX2 without
VNNI saturates where AVX-512 VNNI does not) and between onnxruntime releases. So the record keeps the
checked encoder's embeddings of the export probe texts (`probe_vectors`), and a model's int8 export is
used only where it reproduces them (`same_encoding`); elsewhere `auto` stays on float32 and says why. Each
machine keeps its verdict in the export cache (`kept_verdict`), so only its first start probes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import replace_file

logger = logging.getLogger(__name__)

QUALITY_FILE = "toolscout-quality.json"
TOLERANCE = 0.3  # points of macro nDCG@10 on the dev test splits a faster encoding may move
SAME_ENCODING_COSINE = 0.999  # a probe vector this close to the recorded one: the same int8 kernels (to rounding)


def recorded(model_folder: str | Path, variant: str = "onnx-int8") -> dict[str, Any] | None:
    """The quality check recorded for `variant` of the model in `model_folder` (None: never checked)."""
    from .packaged import packaged_manifest

    folder = Path(model_folder)
    if (shipped := packaged_manifest(folder)) is not None:  # a packaged model: the check is in its manifest
        checks = shipped.get("quality", {})
    elif (folder / QUALITY_FILE).is_file():
        checks = json.loads((folder / QUALITY_FILE).read_text())
    else:
        return None
    return checks.get(variant)


def approved(model_folder: str | Path, variant: str = "onnx-int8") -> bool:
    """True when `variant` passed the recorded check (|Δ macro nDCG@10| < TOLERANCE) and the record keeps
    the probe vectors that tie it to one encoding."""
    check = recorded(model_folder, variant)
    return bool(check) and bool(check.get("passed")) and abs(float(check.get("macro_delta", 1e9))) < TOLERANCE \
        and bool(check.get("probe_vectors"))


def verdict(per_set_exact: dict[str, float], per_set_fast: dict[str, float],
            probe_vectors: np.ndarray | None = None) -> dict[str, Any]:
    """The check's record from both encodings' nDCG@10 per set (the same sets and queries) and the fast
    encoder's embeddings of the export probe texts (`onnx_export.PROBE_TEXTS`)."""
    sets = sorted(per_set_exact)
    exact = sum(per_set_exact[s] for s in sets) / len(sets)
    fast = sum(per_set_fast[s] for s in sets) / len(sets)
    check = {"passed": abs(fast - exact) < TOLERANCE, "macro_exact": round(exact, 3), "macro_fast": round(fast, 3),
             "macro_delta": round(fast - exact, 3), "tolerance": TOLERANCE,
             "per_set": {s: {"exact": round(per_set_exact[s], 3), "fast": round(per_set_fast[s], 3)} for s in sets}}
    if probe_vectors is not None:
        check["probe_vectors"] = _pack(probe_vectors)
    return check


def same_encoding(check: dict[str, Any], probe_vectors: np.ndarray) -> tuple[bool, float]:
    """Whether `probe_vectors` (this machine's encoding of the probe texts) are the ones the check
    measured: (every probe's cosine >= SAME_ENCODING_COSINE, the worst cosine)."""
    recorded_vectors = _unpack(check.get("probe_vectors") or "")
    if recorded_vectors is None or recorded_vectors.shape != probe_vectors.shape:
        return False, float("nan")
    norms = np.linalg.norm(recorded_vectors, axis=1) * np.linalg.norm(probe_vectors, axis=1)
    cosines = np.sum(recorded_vectors * probe_vectors, axis=1) / np.where(norms > 0, norms, 1.0)
    worst = float(cosines.min()) if len(cosines) else float("nan")
    return bool(len(cosines)) and worst >= SAME_ENCODING_COSINE, worst


def _pack(vectors: np.ndarray) -> str:
    """float16 rows as base64 text (`rows x dim` in front): compact enough for a JSON manifest."""
    rows = np.asarray(vectors, dtype=np.float16)
    return f"{rows.shape[0]}x{rows.shape[1]}:" + base64.b64encode(rows.tobytes()).decode("ascii")


def _unpack(text: str) -> np.ndarray | None:
    try:
        shape, data = text.split(":", 1)
        rows, dim = (int(n) for n in shape.split("x"))
        return np.frombuffer(base64.b64decode(data), dtype=np.float16).reshape(rows, dim).astype(np.float32)
    except ValueError:  # malformed record: treated as no record
        return None


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


VERDICTS = "int8-probe"  # the folder of an export cache that keeps each machine's probe verdicts


def machine_key(check: dict[str, Any], export: Path) -> str | None:
    """What decides whether this machine's encoding of the int8 `export` is the one `check` measured: the CPU
    (its model and instruction-set flags: int8 kernels are chosen by them; read on Linux), the onnxruntime
    version, the export's graph file (its path, size and time: a new export of retrained weights is another
    file) and the check's probe vectors. None where a verdict is not kept: no CPU description here (not
    Linux), or no export yet."""
    import onnxruntime

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            # every distinct model and flags line (a machine's cores normally share one of each)
            cpu = "".join(dict.fromkeys(line for line in fh if line.startswith(("model name", "flags", "Features"))))
        graph = (Path(export) / "model.onnx").stat()
    except OSError:
        return None
    if not cpu:
        return None
    text = "|".join((cpu, onnxruntime.__version__, str(Path(export).resolve()), str(graph.st_size),
                     str(graph.st_mtime_ns), str(check.get("probe_vectors", ""))))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def kept_verdict(cache: Path, check: dict[str, Any], export: Path) -> tuple[bool, float] | None:
    """The probe verdict (`same_encoding`) this machine reached for `check` on `export` before, or None."""
    try:
        key = machine_key(check, export)
        kept = json.loads((cache / VERDICTS / f"{key}.json").read_text(encoding="utf-8")) if key else None
        if not isinstance(kept, dict) or not isinstance(kept.get("same"), bool):
            return None  # none kept, or a damaged file: probe again
        return kept["same"], float(kept["worst"])
    except (OSError, ValueError, KeyError, TypeError, ImportError):  # no onnxruntime: loading the graph says so
        return None


def keep_verdict(cache: Path, check: dict[str, Any], export: Path, same: bool, worst: float) -> None:
    """Keep this machine's probe verdict for `check` on `export`, so that later starts learn it without
    probing, and, where int8 is not the checked encoding, without loading the int8 graph. A cache that cannot
    be written only costs the probe next time."""
    key = machine_key(check, export)
    if key is None:
        return
    try:
        replace_file(cache / VERDICTS / f"{key}.json", json.dumps({"same": bool(same), "worst": float(worst)}))
    except OSError as exc:
        logger.info("int8 probe verdict not kept in %s: %s", cache / VERDICTS, exc)

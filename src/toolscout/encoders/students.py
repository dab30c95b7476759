"""Query students: smaller encoders, shipped beside a packaged model, that encode its tasks faster.

Encoding the task is about half of a search's CPU (docs/serving.md), and a task is one short text, so a
network with fewer layers that gives nearly the teacher's vectors makes every search cheaper while the
tools keep the teacher's vectors. A student is a packaged model (`packaged.package_student`) whose
manifest says `role: "queries"`, names its teacher and the SHA-256 of the teacher's stored layers (a
rebuilt teacher disowns a student distilled from the old one), and records its own quality check.

An encoder uses its student for `encode_queries` only when all of these hold:
- the encoder runs its checked int8 encoding (`backend` "auto" or "onnx-int8", in use "onnx-int8"): the
  student's check compared it with exactly that;
- the student's recorded check passed: the default pipeline's macro nDCG@10 over the dev test splits
  moved by less than 0.3 against the teacher's int8 tasks (`benchmarks/query_student.py --record`);
- the student's int8 export on this machine reproduces the vectors that check measured (as for any
  int8 encoding, `encoders/quality.py`).
Otherwise the teacher encodes tasks itself, and the reason is logged. `Encoder(query_students=False)` (or
`--no-query-student` where the CLI offers it) keeps the teacher for tasks.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import packaged

if TYPE_CHECKING:
    from . import Encoder

logger = logging.getLogger(__name__)

ROLE = "queries"
_loaded: dict[tuple, "Encoder"] = {}  # one student per settings per process (its ONNX session is shared)
_lock = threading.Lock()


def students_of(teacher_folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """(name, manifest) of every packaged query student distilled from the packaged model in
    `teacher_folder` as it is now (the SHA-256 of its stored layers matches)."""
    digest = packaged.file_sha256(teacher_folder / packaged.LAYERS)
    return [(name, info) for name, folder in packaged.packaged_models().items()
            if (info := packaged.manifest(folder)).get("role") == ROLE
            and info.get("teacher") == teacher_folder.name and info.get("teacher_layers_sha256") == digest]


def query_student_for(encoder: "Encoder") -> "Encoder | None":
    """The student that encodes `encoder`'s tasks here, or None (the module doc says when)."""
    source = packaged.assembled_from(encoder.path)
    if source is None or not (source / packaged.LAYERS).is_file():
        return None
    found = students_of(source)
    if not found:
        return None
    name, _info = found[0]
    if encoder.backend not in ("auto", "onnx-int8") or encoder.backend_in_use != "onnx-int8":
        logger.info("encoder %s: tasks stay on it, not its student %s: it does not run its checked int8 encoding "
                    "(%s)", encoder.name, name, encoder.fallback_reason or f"backend {encoder.backend!r}")
        return None
    student = _student(name, encoder)
    if student.backend_in_use != "onnx-int8":
        logger.info("encoder %s: tasks stay on it, not its student %s: %s", encoder.name, name,
                    student.fallback_reason or "the student has no passed quality check")
        return None
    return student


def _student(name: str, teacher: "Encoder") -> "Encoder":
    from . import Encoder

    key = (name, teacher.device, teacher.max_seq_length, str(teacher.cache_dir), teacher.latest_turn_weight)
    with _lock:
        if key not in _loaded:
            student = Encoder.load(name, device=teacher.device, max_seq_length=teacher.max_seq_length,
                                   cache_dir=teacher.cache_dir, query_students=False)
            student.latest_turn_weight = teacher.latest_turn_weight
            _loaded[key] = student
        return _loaded[key]

"""Query students: smaller encoders, shipped beside a packaged model, that encode its tasks faster (the
"student" fast tier, `encoders/fast.py`).

Encoding the task is about half of a search's CPU (docs/serving.md), and a task is one short text, so a
network with fewer layers that gives nearly the teacher's vectors makes every search cheaper while the
tools keep the teacher's vectors. A student is a packaged model (`train.packaging.package_student`) whose
manifest says `role: "queries"`, names its teacher and the SHA-256 of the teacher's stored layers (a
rebuilt teacher disowns a student distilled from the old one), and records its own quality check.

A student encodes an encoder's tasks only when all of these hold, else `query_student_for` says why:
- it was distilled from the encoder's current weights;
- the encoder runs its checked int8 encoding (in use "onnx-int8"): the student's check compared it with
  exactly that;
- the student's recorded check passed: the default pipeline's macro nDCG@10 over the dev test splits
  moved by less than 0.3 against the teacher's int8 tasks (`scripts/record_quality_check.py`);
- the student's int8 export on this machine reproduces the vectors that check measured (as for any
  int8 encoding, `encoders/quality.py`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import packaged
from .quality import approved
from ..errors import FastQueriesUnavailable, MissingDependency

if TYPE_CHECKING:
    from . import Encoder

ROLE = "queries"
_loaded: dict[tuple, "Encoder"] = {}  # one student per settings per process (its ONNX session is shared)
_lock = threading.Lock()


class QueryStudentError(FastQueriesUnavailable):
    """No query student can encode this encoder's tasks here (none ships for its weights, or its check
    did not pass or does not reproduce on this machine)."""


def shipped_students() -> list[tuple[str, dict[str, Any]]]:
    """(name, manifest) of every packaged query student."""
    return [(name, info) for name, folder in packaged.packaged_models().items()
            if (info := packaged.manifest(folder)).get("role") == ROLE]


def students_of(teacher_folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """(name, manifest) of every packaged query student distilled from the packaged model in
    `teacher_folder` as it is now (the SHA-256 of its stored layers matches)."""
    digest = packaged.file_sha256(teacher_folder / packaged.LAYERS)
    return [(name, info) for name, info in shipped_students()
            if info.get("teacher") == teacher_folder.name and info.get("teacher_layers_sha256") == digest]


def query_student_for(encoder: "Encoder") -> "Encoder":
    """The student that encodes `encoder`'s tasks here; QueryStudentError says why there is none."""
    source = packaged.package_folder(encoder.path)
    found = students_of(source) if source is not None and (source / packaged.LAYERS).is_file() else []
    if not found:
        shipped = sorted(info.get("teacher", "?") for _name, info in shipped_students())
        raise QueryStudentError(f"no query student was distilled from the current weights of {encoder.name!r}; "
                                f"toolscout ships students for: {', '.join(shipped) or 'none'}")
    name = found[0][0]
    if encoder.backend_in_use != "onnx-int8":
        raise QueryStudentError(f"the query student {name} was checked beside {encoder.name}'s int8 encoding, which "
                                f"does not run here ({encoder.fallback_reason or f'backend {encoder.backend!r}'})")
    if not approved(packaged.packaged_models()[name]):  # refused before assembling and exporting it for nothing
        raise QueryStudentError(f"the query student {name} cannot serve here: its quality check did not pass or "
                                "was not recorded")
    try:
        student = _student(name, encoder)
    except (packaged.PackagedModelError, MissingDependency) as exc:  # a lean install: no base, no torch
        raise QueryStudentError(f"the query student {name} cannot load here: {exc}") from exc
    if student.backend_in_use != "onnx-int8":
        raise QueryStudentError(f"the query student {name} cannot serve here: "
                                f"{student.fallback_reason or 'its quality check did not pass or was not recorded'}")
    return student


def _student(name: str, teacher: "Encoder") -> "Encoder":
    from . import Encoder

    key = (name, teacher.device, teacher.max_seq_length, str(teacher.cache_dir), teacher.latest_turn_weight)
    with _lock:
        if key not in _loaded:
            student = Encoder.load(name, device=teacher.device, max_seq_length=teacher.max_seq_length,
                                   cache_dir=teacher.cache_dir)
            student.latest_turn_weight = teacher.latest_turn_weight
            _loaded[key] = student
        return _loaded[key]


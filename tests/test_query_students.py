"""Query students (`encoders/students.py`): an encoder hands its tasks to the smaller model shipped beside it
only when the student's recorded quality check passed, this machine reproduces the checked int8 encoding,
the encoder itself runs its checked int8 encoding, and the student was distilled from the encoder's
current weights. Tools keep the encoder's vectors."""

import json

import numpy as np
import pytest

from toolscout.encoders import PROBE_TEXTS, Encoder
from toolscout.encoders import packaged as packaging
from toolscout.encoders import students
from toolscout.encoders.quality import record, verdict

TASKS = ["book a flight to Rome", "send an email to my boss about the meeting"]
PASSED = ({"a": 50.0, "b": 60.0}, {"a": 50.1, "b": 59.9})  # macro moves by 0: passes
FAILED = ({"a": 50.0, "b": 60.0}, {"a": 49.0, "b": 59.0})  # macro moves by -1: fails


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A packaged teacher (MiniLM with one tensor changed) and its two-layer student, both with a passed
    int8 check recorded from this machine's own int8 encodings, in a models folder of their own."""
    from sentence_transformers import SentenceTransformer

    from toolscout.artifacts import write_artifact
    from toolscout.encoders import resolve_model
    from toolscout.models import model_base
    from toolscout.train.query_student import student_of

    root = tmp_path_factory.mktemp("students")
    model = SentenceTransformer(resolve_model("minilm"), device="cpu")
    model[0].auto_model.encoder.layer[5].output.dense.weight.data.mul_(0.5)
    with write_artifact(root / "trained", model_base("embed", encoder="encoder", summary={}, view={})) as folder:
        model.save(str(folder / "encoder"))
    models = root / "models"
    packaging.package(root / "trained", models / "tiny-teacher", name="tiny-teacher", probes=("x",))
    student_of(model, [0, 5]).save(str(root / "student"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packaging, "MODELS_DIR", models)
        packaging.package_student(root / "student", models / "tiny-student", name="tiny-student", layers=[0, 5],
                                  teacher="tiny-teacher", probes=("x",))
        for name in ("tiny-teacher", "tiny-student"):
            int8 = Encoder.load(name, backend="onnx-int8", cache_dir=root / "onnx", query_students=False)
            record(models / name, verdict(*PASSED, probe_vectors=int8.encode(list(PROBE_TEXTS))))
    return root


@pytest.fixture
def models(shipped, monkeypatch):
    monkeypatch.setattr(packaging, "MODELS_DIR", shipped / "models")
    monkeypatch.setattr(students, "_loaded", {})
    return shipped / "models"


def load(shipped, name="tiny-teacher", **options):
    return Encoder.load(name, cache_dir=shipped / "onnx", **options)


def test_tasks_go_to_a_checked_student_and_tools_stay_on_the_teacher(shipped, models):
    teacher = load(shipped)
    assert teacher.backend_in_use == "onnx-int8" and teacher.query_student is not None
    alone = load(shipped, query_students=False)
    assert alone.query_student is None
    student = Encoder.load("tiny-student", backend="onnx-int8", cache_dir=shipped / "onnx", query_students=False)
    np.testing.assert_allclose(teacher.encode_queries(TASKS), student.encode_queries(TASKS), atol=1e-6)
    np.testing.assert_allclose(teacher.encode(TASKS), alone.encode(TASKS), atol=1e-6)  # tools: the teacher's
    assert float(np.min(np.sum(alone.encode_queries(TASKS) * student.encode_queries(TASKS), axis=1))) < 0.99


def test_a_student_whose_check_failed_or_is_missing_is_not_used(shipped, models):
    manifest = json.loads((models / "tiny-student" / packaging.MANIFEST).read_text())
    try:
        record(models / "tiny-student", {**manifest["quality"]["onnx-int8"], **verdict(*FAILED)})
        assert load(shipped).query_student is None
        students._loaded.clear()
        (models / "tiny-student" / packaging.MANIFEST).write_text(json.dumps({**manifest, "quality": {}}))
        assert load(shipped).query_student is None
    finally:
        (models / "tiny-student" / packaging.MANIFEST).write_text(json.dumps(manifest))
    students._loaded.clear()
    assert load(shipped).query_student is not None  # the manifest put back: used again


def test_a_student_of_other_teacher_weights_or_beside_float32_tasks_is_not_used(shipped, models):
    assert load(shipped, backend="exact").query_student is None  # float32 teacher: the check compared int8
    manifest = json.loads((models / "tiny-student" / packaging.MANIFEST).read_text())
    try:
        (models / "tiny-student" / packaging.MANIFEST).write_text(
            json.dumps({**manifest, "teacher_layers_sha256": "0" * 64}))  # distilled from a teacher since rebuilt
        assert load(shipped).query_student is None
    finally:
        (models / "tiny-student" / packaging.MANIFEST).write_text(json.dumps(manifest))

"""Query students: their trainer (`toolscout.train.query_student`: a smaller copy of an encoder learns the
encoder's task vectors), and their use (`encoders/students.py`, the "student" fast tier): a smaller model
shipped beside an encoder encodes its tasks only when the student's recorded quality check passed, this
machine reproduces the checked int8 encoding, the encoder itself runs its checked int8 encoding, and the
student was distilled from the encoder's current weights. Tools keep the encoder's vectors."""

import json
from pathlib import Path

import numpy as np
import pytest

from toolscout.encoders import PROBE_TEXTS, Encoder, packaged, students
from toolscout.encoders.quality import record, verdict
from toolscout.encoders.students import QueryStudentError, query_student_for
from toolscout.retrievers.base import task_encoders
from toolscout.retrievers.dense import DenseRetriever
from toolscout.train import packaging
from toolscout.train.query_student import Phase, build, training_texts

pytestmark = pytest.mark.slow  # distils a student, starts a server

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
        patch.setattr(packaged, "MODELS_DIR", models)
        packaging.package_student(root / "student", models / "tiny-student", name="tiny-student", layers=[0, 5],
                                  teacher="tiny-teacher", probes=("x",))
        for name in ("tiny-teacher", "tiny-student"):
            int8 = Encoder.load(name, backend="onnx-int8", cache_dir=root / "onnx")
            record(models / name, verdict(*PASSED, probe_vectors=int8.encode(list(PROBE_TEXTS))))
    return root


@pytest.fixture
def models(shipped, monkeypatch):
    monkeypatch.setattr(packaged, "MODELS_DIR", shipped / "models")
    monkeypatch.setattr(students, "_loaded", {})
    return shipped / "models"


def load(shipped, name="tiny-teacher", **options):
    return Encoder.load(name, cache_dir=shipped / "onnx", **options)


def rewrite_manifest(models, **changes):
    path = models / "tiny-student" / packaged.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    students._loaded.clear()


def test_the_student_tier_encodes_tasks_by_the_student_and_tools_by_the_teacher(shipped, models, tools):
    from toolscout import ToolScout

    teacher = load(shipped)
    assert teacher.backend_in_use == "onnx-int8"
    student = query_student_for(teacher)
    reference = Encoder.load("tiny-student", backend="onnx-int8", cache_dir=shipped / "onnx")
    np.testing.assert_allclose(student.encode_queries(TASKS), reference.encode_queries(TASKS), atol=1e-6)
    assert float(np.min(np.sum(teacher.encode_queries(TASKS) * reference.encode_queries(TASKS), axis=1))) < 0.99

    scout = ToolScout.from_tools(tools, encoder=teacher, retriever="dense", intents=None)
    plain = scout.search(["book a flight to Rome"], k=3)[0]
    scout.use_fast_queries("student")
    assert task_encoders(scout.retriever) == ["tiny-student (query student of tiny-teacher)"]
    assert scout.fast_queries == "student"
    hits = scout.search(["book a flight to Rome"], k=3)[0]
    by_student = reference.encode_queries(["book a flight to Rome"])[0]
    teacher_only = DenseRetriever(encoder=load(shipped))
    teacher_only.index(tools)
    stored = teacher_only.store.get([hits[0].tool.id])[0]  # tools: the teacher's vectors, tasks: the student's
    assert abs(hits[0].score - float(stored @ by_student)) < 1e-5 and hits[0].score != plain[0].score


def test_a_student_whose_check_failed_or_is_missing_is_refused(shipped, models):
    manifest = json.loads((models / "tiny-student" / packaged.MANIFEST).read_text())
    try:
        rewrite_manifest(models, quality={"onnx-int8": {**manifest["quality"]["onnx-int8"], **verdict(*FAILED)}})
        teacher = load(shipped)
        assert teacher.backend_in_use == "onnx-int8"
        exports = sorted((shipped / "onnx").iterdir())
        with pytest.raises(QueryStudentError, match="cannot serve here"):
            query_student_for(teacher)
        assert sorted((shipped / "onnx").iterdir()) == exports  # refused before exporting a student it cannot use
        rewrite_manifest(models, quality={})
        with pytest.raises(QueryStudentError, match="cannot serve here"):
            query_student_for(load(shipped))
    finally:
        rewrite_manifest(models, **manifest)
    assert query_student_for(load(shipped)).name == "tiny-student"  # the manifest put back: it serves again


def test_a_student_of_other_teacher_weights_or_beside_float32_tasks_is_refused(shipped, models):
    with pytest.raises(QueryStudentError, match="int8 encoding, which does not run here"):
        query_student_for(load(shipped, backend="exact"))  # the check compared the teacher's int8 tasks
    manifest = json.loads((models / "tiny-student" / packaged.MANIFEST).read_text())
    try:
        rewrite_manifest(models, teacher_layers_sha256="0" * 64)  # distilled from a teacher since rebuilt
        with pytest.raises(QueryStudentError, match="no query student was distilled from the current weights"):
            query_student_for(load(shipped))
    finally:
        rewrite_manifest(models, **manifest)


# ------------------------------------------------------------------ the student shipped with toolscout

@pytest.fixture(scope="module")
def shipped_student():
    """The default encoder's packaged student, where this machine can serve it (its int8 check reproduces)."""
    from toolscout.defaults import DEFAULT_ENCODER

    try:
        return query_student_for(Encoder.load(DEFAULT_ENCODER))
    except QueryStudentError as exc:
        pytest.skip(f"the shipped query student cannot serve on this machine: {exc}")


def test_the_shipped_student_is_distilled_from_the_shipped_encoder_and_gives_its_reference_vectors(tmp_path):
    from toolscout.defaults import DEFAULT_ENCODER

    folder = packaged.packaged_models()["toolscout-tools-queries"]
    info = packaged.manifest(folder)
    teacher = packaged.packaged_models()[DEFAULT_ENCODER]
    assert info["role"] == "queries" and info["teacher"] == DEFAULT_ENCODER and info["layers"] == [0, 2, 4, 5]
    assert info["teacher_layers_sha256"] == packaged.file_sha256(teacher / packaged.LAYERS)
    check = info["quality"]["onnx-int8"]
    assert check["passed"] and abs(check["macro_delta"]) < check["tolerance"] == 0.3
    encoder = Encoder.load("toolscout-tools-queries", backend="torch", cache_dir=tmp_path / "onnx")
    assert json.loads((Path(encoder.path) / "config.json").read_text())["num_hidden_layers"] == 4
    reference = np.load(folder / packaged.REFERENCE)
    np.testing.assert_allclose(encoder.encode([str(t) for t in reference["texts"]]), reference["vectors"], atol=1e-5)


def test_a_server_started_with_the_student_tier_ranks_by_the_student(tmp_path, tools, encoder, shipped_student):
    from servers import served_search

    from toolscout import ToolScout

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, encoder=encoder).save(folder)
    task = "convert the attached document to pdf and mail it"
    expected = [(h.tool.id, h.score) for h in ToolScout.load(folder, fast_queries="student").search(task, k=4)]
    default = [(h.tool.id, h.score) for h in ToolScout.load(folder).search(task, k=4)]
    assert [s for _, s in expected] != [s for _, s in default]
    health, hits = served_search(["--student-queries", str(folder), "--no-fsync"], task, k=4)
    assert health["task_encoders"] == [f"{shipped_student.name} (query student of {encoder.name})"]
    assert [h["id"] for h in hits] == [t for t, _ in expected]
    np.testing.assert_allclose([h["score"] for h in hits], [s for _, s in expected], rtol=1e-5)


def test_the_tier_flags_read_before_or_after_the_index_and_exclude_each_other(capsys):
    """`serve --fast-queries DIR` still reads DIR as the index (the flag takes no value), each flag picks its
    tier, and asking for both is refused."""
    from toolscout.cli import build_parser

    parser = build_parser()
    for argv, tier in ((["serve", "--fast-queries", "idx"], "table"), (["serve", "idx", "--student-queries"], "student"),
                       (["search", "idx", "a task", "--fast-queries"], "table"), (["serve", "idx"], None)):
        args = parser.parse_args(argv)
        assert (args.fast_queries, args.dir) == (tier, "idx")
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "idx", "--fast-queries", "--student-queries"])
    assert "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- the trainer

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


def _cosine_to_teacher(folder, texts) -> float:
    student = Encoder.load(str(folder), backend="torch").encode(texts.validation)
    return float(np.mean(np.sum(student * texts.validation_targets, axis=1)))


def _minilm_reading_64_tokens(folder: Path) -> str:
    """MiniLM saved with max_seq_length 64 (its students copy it): a training batch of 64 texts, the
    sample's tool texts some 200 tokens long, then costs about a quarter of what it does at MiniLM's 256."""
    from sentence_transformers import SentenceTransformer

    from toolscout.encoders import resolve_model

    model = SentenceTransformer(resolve_model("minilm"), device="cpu")
    model.max_seq_length = 64
    model.save(str(folder))
    return str(folder)


def test_distilling_brings_a_two_layer_student_closer_to_its_teacher(tmp_path):
    """Layers 0 and 5 of MiniLM (reading 64 tokens), untrained, against the same after a short run of both
    kinds of phase (vector loss, then with the ranking loss): the validation tasks' cosine to the teacher
    rises, the saved folder is a two-layer sentence-transformers model, and the word embeddings are the
    teacher's."""
    from safetensors.numpy import load_file

    from toolscout.encoders import resolve_model
    from toolscout.train.query_student import WORD_EMBEDDINGS, student_of

    teacher_folder = _minilm_reading_64_tokens(tmp_path / "teacher")
    teacher = Encoder.load(teacher_folder, backend="torch")
    texts = training_texts([SAMPLE], teacher)
    untrained = tmp_path / "untrained"
    student_of(teacher.model, [0, 5]).save(str(untrained))
    info = build([SAMPLE], tmp_path / "student", teacher_folder, layers=[0, 5],
                 recipe=[Phase(3, 3e-4), Phase(1, 5e-5, kl=1.0)])
    before, after = _cosine_to_teacher(untrained, texts), _cosine_to_teacher(tmp_path / "student", texts)
    assert after > before + 0.02, (before, after)
    assert abs(info["validation"]["cosine"] - after) < 0.01  # the recorded figure is the saved model's
    assert [p["kl"] for p in info["recipe"]] == [0.0, 1.0] and all(p["history"] for p in info["recipe"])
    weights = load_file(str(tmp_path / "student" / "model.safetensors"))
    assert not any(name.startswith("encoder.layer.2.") for name in weights)
    base = load_file(str(Path(resolve_model("minilm")) / "model.safetensors"))
    np.testing.assert_array_equal(weights[WORD_EMBEDDINGS], base[WORD_EMBEDDINGS])

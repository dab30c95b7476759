"""The query student's trainer (`toolscout.train.query_student`): a smaller copy of an encoder learns the
encoder's task vectors."""

from pathlib import Path

import numpy as np

from toolscout.encoders import Encoder
from toolscout.train.query_student import Phase, build, training_texts

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


def _cosine_to_teacher(folder, texts) -> float:
    student = Encoder.load(str(folder), backend="torch").encode(texts.validation)
    return float(np.mean(np.sum(student * texts.validation_targets, axis=1)))


def test_distilling_brings_a_two_layer_student_closer_to_its_teacher(tmp_path):
    """Layers 0 and 5 of MiniLM, untrained, against the same after a short run of both kinds of phase
    (vector loss, then with the ranking loss): the validation tasks' cosine to the teacher rises, the
    saved folder is a two-layer sentence-transformers model, and the word embeddings are the teacher's."""
    from safetensors.numpy import load_file

    from toolscout.encoders import resolve_model
    from toolscout.train.query_student import WORD_EMBEDDINGS, student_of

    teacher = Encoder.load("minilm", backend="torch")
    texts = training_texts([SAMPLE], teacher)
    untrained = tmp_path / "untrained"
    student_of(teacher.model, [0, 5]).save(str(untrained))
    info = build([SAMPLE], tmp_path / "student", "minilm", layers=[0, 5],
                 recipe=[Phase(6, 3e-4), Phase(1, 5e-5, kl=1.0)])
    before, after = _cosine_to_teacher(untrained, texts), _cosine_to_teacher(tmp_path / "student", texts)
    assert after > before + 0.02, (before, after)
    assert abs(info["validation"]["cosine"] - after) < 0.01  # the recorded figure is the saved model's
    assert [p["kl"] for p in info["recipe"]] == [0.0, 1.0] and all(p["history"] for p in info["recipe"])
    weights = load_file(str(tmp_path / "student" / "model.safetensors"))
    assert not any(name.startswith("encoder.layer.2.") for name in weights)
    base = load_file(str(Path(resolve_model("minilm")) / "model.safetensors"))
    np.testing.assert_array_equal(weights[WORD_EMBEDDINGS], base[WORD_EMBEDDINGS])

"""Models that ship with toolscout: stored as trained layers over an installed base, assembled on first use."""

from pathlib import Path

import numpy as np
import pytest

from toolscout.encoders import Encoder
from toolscout.encoders import packaged
from toolscout.train import packaging


@pytest.fixture
def trained_dir(tmp_path):
    """A `toolscout train embed` directory whose model differs from MiniLM in one tensor."""
    from sentence_transformers import SentenceTransformer

    from toolscout.artifacts import write_artifact
    from toolscout.encoders import resolve_model
    from toolscout.models import model_base

    model = SentenceTransformer(resolve_model("minilm"), device="cpu")
    layer = model[0].auto_model.encoder.layer[5].output.dense
    layer.weight.data.mul_(0.5)  # a big enough change to move every embedding
    out = tmp_path / "trained"
    with write_artifact(out, model_base("embed", encoder="encoder", summary={"steps": 1}, view={})) as folder:
        model.save(str(folder / "encoder"))
    return out


def test_a_packaged_model_is_the_trained_layers_and_assembles_to_the_trained_vectors(trained_dir, tmp_path,
                                                                                      monkeypatch):
    package = tmp_path / "models" / "mini-test"
    info = packaging.package(trained_dir, package, name="mini-test", probes=("book a flight", "send an email"))
    assert info["tensors"] == 1 and info["trained"] == {"steps": 1}
    assert (package / packaged.LAYERS).stat().st_size < 2 * 384 * 1536 + 4096  # one float16 matrix, not the model
    monkeypatch.setattr(packaged, "MODELS_DIR", tmp_path / "models")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the assembly cache
    encoder = Encoder.load("mini-test", backend="torch")
    assert encoder.name == "mini-test" and str(tmp_path / "home") in encoder.path
    reference = np.load(package / packaged.REFERENCE)
    got = encoder.encode(list(reference["texts"]))
    np.testing.assert_allclose(got, reference["vectors"], atol=1e-6)
    minilm = Encoder.load("minilm", backend="torch").encode(list(reference["texts"]))
    assert float(np.min(np.sum(got * minilm, axis=1))) < 0.999  # the trained layer is in, not the base's
    assembled = packaged.assemble(package)
    assert packaged.assemble(package) == assembled  # assembled once, then reused
    # recording an int8 quality check writes the manifest and changes no weight: the same folder, so the same
    # export (it was assembled anew under another name, and exported again)
    from toolscout.encoders.cache import folder_fingerprint
    from toolscout.encoders.quality import record, recorded, verdict

    before = folder_fingerprint(assembled)
    record(package, verdict({"a": 50.0}, {"a": 50.1}))
    assert recorded(assembled)["passed"] and packaged.assemble(package) == assembled
    assert folder_fingerprint(assembled) == before


def test_a_base_other_than_the_one_trained_on_is_refused(trained_dir, tmp_path):
    import json

    package = tmp_path / "mini-test"
    packaging.package(trained_dir, package, name="mini-test", probes=("x",))
    manifest = json.loads((package / packaged.MANIFEST).read_text())
    (package / packaged.MANIFEST).write_text(json.dumps({**manifest, "base_sha256": "0" * 64}))
    with pytest.raises(packaged.PackagedModelError, match="different 'minilm' than the one installed"):
        packaged.assemble(package, tmp_path / "cache")


def test_a_blended_package_stores_the_weights_between_base_and_trained(trained_dir, tmp_path):
    """blend 0.5 of a layer trained to half the base's weights stores base + 0.5 * (0.5 * base - base),
    i.e. 0.75 * base, in float16."""
    from safetensors.numpy import load_file

    from toolscout.encoders import resolve_model

    package = tmp_path / "blended"
    info = packaging.package(trained_dir, package, name="blended", blend=0.5, probes=("x",))
    assert info["blend"] == 0.5 and info["tensors"] == 1
    name = "encoder.layer.5.output.dense.weight"
    stored = load_file(str(package / packaged.LAYERS))[name]
    base = load_file(str(Path(resolve_model("minilm")) / packaged.WEIGHTS))[name]
    np.testing.assert_array_equal(stored, (0.75 * base).astype(np.float16))
    with pytest.raises(ValueError, match="blend"):
        packaging.package(trained_dir, tmp_path / "bad", name="bad", blend=0.0)


def test_the_shipped_default_encoder_loads_offline_from_the_package_and_gives_its_reference_vectors(
        tmp_path, monkeypatch):
    """toolscout-tools assembles from the installed package with no network (sockets refused, a fresh
    home and cache) and embeds its probe texts exactly as the build saved them (reference.npz)."""
    import socket

    import toolscout
    from toolscout.defaults import DEFAULT_ENCODER

    def no_network(*args, **kwargs):
        raise AssertionError("the shipped encoder must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # nothing assembled yet
    folder = packaged.packaged_models()[DEFAULT_ENCODER]
    assert folder.is_relative_to(Path(toolscout.__file__).parent)  # package data, not a download
    reference = np.load(folder / packaged.REFERENCE)
    encoder = Encoder.load(DEFAULT_ENCODER, backend="torch", cache_dir=tmp_path / "onnx")
    assert str(encoder.path).startswith(str(tmp_path / "home"))  # assembled just now, into the fresh home
    vectors = encoder.encode([str(t) for t in reference["texts"]])
    np.testing.assert_allclose(vectors, reference["vectors"], atol=1e-5)
    base = Encoder.load("minilm", backend="torch", cache_dir=tmp_path / "onnx").encode([str(reference["texts"][0])])
    assert float(base[0] @ vectors[0]) < 0.999  # the tuned layers are in use, not the bare base


def test_from_tools_with_no_arguments_embeds_with_the_shipped_encoder():
    """`ToolScout.from_tools(tools)`: the default hybrid, whose dense part stores exactly the vectors a
    dense retriever on toolscout-tools makes, not the untrained MiniLM's."""
    from toolscout import Tool, ToolScout
    from toolscout.defaults import DEFAULT_ENCODER
    from toolscout.retrievers.dense import DenseRetriever

    tools = [Tool(id="mail.send_email", name="send_email", description="Send an email to a recipient"),
             Tool(id="weather.get_weather", name="get_weather", description="Current weather for a city")]
    ids = [t.id for t in tools]
    scout = ToolScout.from_tools(tools)
    assert scout.retriever.name == "hybrid"
    dense = next(c for c in scout.retriever.components if c.name == "dense")
    assert dense.encoder.name == DEFAULT_ENCODER
    stored = dense.store.get(ids)
    vectors = {}
    for model in (DEFAULT_ENCODER, "minilm"):
        explicit = DenseRetriever(model=model)
        explicit.index(tools)
        vectors[model] = explicit.store.get(ids)
    np.testing.assert_allclose(stored, vectors[DEFAULT_ENCODER], atol=1e-6)
    assert np.abs(stored - vectors["minilm"]).max() > 1e-2


def test_a_student_package_keeps_some_base_layers_and_assembles_to_the_student(tmp_path, monkeypatch):
    """A model keeping layers 0 and 5 of MiniLM: layers the student did not change are not stored (the
    kept base layers, renumbered, are them), one it changed is, and the assembled folder is a two-layer
    model that embeds exactly as the student does."""
    import json

    from sentence_transformers import SentenceTransformer

    from toolscout.encoders import resolve_model
    from toolscout.train.query_student import student_of

    student = student_of(SentenceTransformer(resolve_model("minilm"), device="cpu"), [0, 5])
    student[0].auto_model.encoder.layer[1].output.dense.weight.data.mul_(0.5)  # base layer 5, now the second
    student.save(str(tmp_path / "student"))
    package = tmp_path / "models" / "mini-student"
    info = packaging.package_student(tmp_path / "student", package, name="mini-student", layers=[0, 5],
                                     teacher="minilm", probes=("book a flight", "send an email"))
    assert info["tensors"] == 1 and info["layers"] == [0, 5] and info["role"] == "queries"
    from safetensors.numpy import load_file
    assert list(load_file(str(package / packaged.LAYERS))) == ["encoder.layer.1.output.dense.weight"]
    monkeypatch.setattr(packaged, "MODELS_DIR", tmp_path / "models")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    encoder = Encoder.load("mini-student", backend="torch")
    assert json.loads((Path(encoder.path) / "config.json").read_text())["num_hidden_layers"] == 2
    texts = ["book a flight to Rome", "send an email to my boss"]
    expected = student.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(encoder.encode(texts), expected, atol=2e-3)  # float16 storage of one tensor
    full = Encoder.load("minilm", backend="torch").encode(texts)
    assert float(np.min(np.sum(encoder.encode(texts) * full, axis=1))) < 0.99  # two layers, not six


def test_a_student_that_names_a_layer_the_base_lacks_is_refused(tmp_path):
    from sentence_transformers import SentenceTransformer

    from toolscout.encoders import resolve_model
    from toolscout.train.query_student import student_of

    student_of(SentenceTransformer(resolve_model("minilm"), device="cpu"), [0, 5]).save(str(tmp_path / "student"))
    with pytest.raises(packaged.PackagedModelError, match="no transformer layer 9"):
        packaging.package_student(tmp_path / "student", tmp_path / "out", name="x", layers=[0, 9], teacher="minilm")
    with pytest.raises(ValueError, match="each kept once"):
        student_of(SentenceTransformer(resolve_model("minilm"), device="cpu"), [0, 0])

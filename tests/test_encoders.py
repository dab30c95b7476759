"""Encoder backends: the ONNX export must give sentence-transformers' embeddings, batched or not."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from toolscout.encoders import Encoder, OnnxEncoder, OnnxUnavailable, export_onnx, pooling_spec  # noqa: E402
from toolscout.encoders.cache import folder_fingerprint  # noqa: E402
from toolscout.errors import MissingDependency  # noqa: E402

LONG = " ".join(f"Parameter number {i} controls the {i}th option of the request and must be an integer." for i in range(60))

TEXTS = [
    "book a flight to Paris next Tuesday",
    "what's the weather in Zürich tomorrow?",
    "Convert 250 USD to EUR",
    "send_email(to, subject, body)",
    "getCurrentWeather (get Current Weather)\nCurrent temperature, wind and rain at a location.",
    "",
    "x",
    "列出我所有的日历事件",
    "Find emails in the inbox matching a text query. Parameters: query: Words to look for",
    "🙂 can you help me?",
    "search_flights (search flights)\nSearch flights between two airports on a date.\n"
    "Parameters: origin: Departure airport code; destination: Arrival airport code; date: Travel date",
    "Reserve a hotel room in a city for given nights.",
    "List the calendar events between 2024-01-01 and 2024-02-01.",
    "How do I compute the inverse of a matrix with numpy?",
    "read the file /etc/hosts and show me its contents",
    "Latest share price of AAPL",
    "translate 'good morning' into Japanese and French",
    LONG,  # far past max_seq_length (256 tokens): truncation must match too
    LONG.upper(),
    "Create a calendar event titled 'Standup' at 9:30 with Ann, Bob and Chen.",
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def cache_dir():
    """The machine's export cache, which the rest of the suite uses too: the float32 export of the default
    model is made once per machine (minutes on a CPU whose int8 is not the checked one), not once more here."""
    from toolscout.encoders.cache import default_onnx_cache

    return default_onnx_cache()


@pytest.fixture(scope="module")
def onnx_encoder(cache_dir):
    os.environ["HF_HUB_OFFLINE"] = "1"
    return Encoder.load(None, backend="onnx", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def torch_encoder():
    os.environ["HF_HUB_OFFLINE"] = "1"
    return Encoder.load(None, backend="torch")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def test_onnx_matches_sentence_transformers(onnx_encoder, torch_encoder):
    assert onnx_encoder.backend_in_use == "onnx"
    assert onnx_encoder.dim == torch_encoder.dim == 384
    got = onnx_encoder.encode(TEXTS)
    want = torch_encoder.model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosines(got, want).min() >= 0.9999
    # the two long texts were really truncated: their tokens exceed the limit
    assert len(torch_encoder.model.tokenizer(LONG)["input_ids"]) > 256


def test_padding_and_batching_do_not_change_vectors(onnx_encoder):
    one_by_one = np.concatenate([onnx_encoder.encode([t]) for t in TEXTS])
    for batch_size in (1, 3, 7, 64):
        batched = onnx_encoder.encode(TEXTS, batch_size=batch_size)
        assert cosines(batched, one_by_one).min() >= 0.99999, batch_size
    order = np.random.default_rng(0).permutation(len(TEXTS))
    shuffled = onnx_encoder.encode([TEXTS[i] for i in order])
    assert cosines(shuffled, one_by_one[order]).min() >= 0.99999


def test_a_small_call_of_mixed_lengths_is_cut_where_padding_costs_more_than_a_run():
    planner = OnnxEncoder.__new__(OnnxEncoder)
    planner.max_batch_tokens = 4096
    lengths = [250, 12, 30, 31, 29, 80, 9, 40]
    runs = [[lengths[i] for i in run] for run in planner._batches(lengths, 64)]
    assert runs == [[250], [80], [40], [31, 30, 29], [12, 9]]  # longest first, similar lengths together
    assert [len(run) for run in planner._batches([5] * 8, 64)] == [8]  # equal lengths: one run
    assert [len(run) for run in planner._batches([5] * 8, 3)] == [3, 3, 2]  # batch_size still bounds a run
    long_runs = [len(run) for run in planner._batches([300] * 20, 64)]
    assert sum(long_runs) == 20 and max(long_runs) == 4096 // 300  # and so do max_batch_tokens
    rows = sorted(int(i) for run in planner._batches(lengths, 64) for i in run)
    assert rows == list(range(len(lengths)))


def test_fused_skip_layer_norm_runs_as_add_and_layer_norm(onnx_encoder, torch_encoder, tmp_path):
    import onnx
    import onnxruntime as ort

    from toolscout.encoders.onnx_runtime import SPLIT_LAYER_NORM, runtime_graph

    cached = onnx_encoder._onnx  # an export in the cache is stored split: loading it needs no `onnx`
    assert cached.meta[SPLIT_LAYER_NORM] is True
    stored = onnx.load(str(cached.folder / "model.onnx")).graph.node
    assert not any(n.op_type == "SkipLayerNormalization" for n in stored)
    export_onnx(torch_encoder.model, tmp_path, "onnx")  # the fused graph as exported, before it is split
    encoder = OnnxEncoder(tmp_path)
    path = encoder.folder / "model.onnx"
    if not any(n.op_type == "SkipLayerNormalization" for n in onnx.load(str(path)).graph.node):
        pytest.skip("the export is not a fused graph")
    graph = runtime_graph(path)
    ops = {n.op_type for n in onnx.load_from_string(graph).graph.node}
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    as_saved = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = encoder._feeds(encoder.tokenizer.encode_batch(TEXTS[:8]))
    want = as_saved.run(["embedding"], feeds)[0]
    np.testing.assert_allclose(encoder.session.run(["embedding"], feeds)[0], want, atol=1e-6)
    # an export cached before exports were stored split (every load rewrote it) is split once, where it is
    old = tmp_path / "cache" / cached.folder.name
    shutil.copytree(cached.folder, old)
    for name in ("model.onnx", "meta.json"):
        shutil.copyfile(tmp_path / name, old / name)
    assert SPLIT_LAYER_NORM not in json.loads((old / "meta.json").read_text())
    upgraded = Encoder.load(None, backend="onnx", cache_dir=tmp_path / "cache")
    assert upgraded._onnx.folder == old and upgraded._onnx.meta[SPLIT_LAYER_NORM] is True
    assert not any(n.op_type == "SkipLayerNormalization" for n in onnx.load(str(old / "model.onnx")).graph.node)
    # rewritten whole, and still ordinary readable files (a temporary file beside it is made owner-only)
    assert {(old / name).stat().st_mode & 0o777 for name in ("model.onnx", "meta.json")} == {0o644}
    np.testing.assert_allclose(upgraded.encode(TEXTS[:8]), onnx_encoder.encode(TEXTS[:8]), atol=1e-5)


def test_encode_queries_and_empty_input(onnx_encoder):
    assert onnx_encoder.encode([]).shape == (0, 384)
    q = onnx_encoder.encode_queries(["book a flight"])
    assert q.shape == (1, 384) and q.dtype == np.float32
    with pytest.raises(TypeError):
        onnx_encoder.encode("a bare string")


def test_onnx_encoder_is_thread_safe(onnx_encoder):
    want = np.concatenate([onnx_encoder.encode([t]) for t in TEXTS])
    errors, results = [], {}

    def work(worker: int):
        try:
            for rep in range(3):
                for i in range(worker, len(TEXTS), 4):
                    results[(worker, rep, i)] = onnx_encoder.encode([TEXTS[i]])[0]
                results[(worker, rep, "batch")] = onnx_encoder.encode(TEXTS, batch_size=5)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for key, vec in results.items():
        if key[2] == "batch":
            assert cosines(vec, want).min() >= 0.99999
        else:
            assert float(vec @ want[key[2]]) >= 0.99999


def test_cache_file_is_reused_on_second_load(onnx_encoder, cache_dir, monkeypatch):
    export = onnx_encoder._onnx.folder
    assert export.parent == cache_dir
    model_file = export / "model.onnx"
    before = model_file.stat().st_mtime_ns

    import toolscout.encoders.cache as export_cache

    def no_export(*args, **kwargs):
        raise AssertionError("a cached export must not be redone")

    monkeypatch.setattr(export_cache, "export_onnx", no_export)
    again = Encoder.load(None, backend="exact", cache_dir=cache_dir)  # float32: the export above
    assert again.backend_in_use == "onnx"
    assert again._model is None  # a cache hit does not even load the torch model
    assert again._onnx.folder == export and model_file.stat().st_mtime_ns == before  # the same export, untouched
    np.testing.assert_allclose(again.encode(TEXTS[:3]), onnx_encoder.encode(TEXTS[:3]), atol=1e-6)


def test_falls_back_to_torch_when_onnxruntime_is_missing(monkeypatch, tmp_path, caplog, torch_encoder):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    with caplog.at_level(logging.INFO, logger="toolscout.encoders"):
        enc = Encoder.load(None, backend="auto", cache_dir=tmp_path)
    assert enc.backend_in_use == "torch"
    assert "onnxruntime" in enc.fallback_reason
    assert any("onnxruntime" in r.getMessage() for r in caplog.records)
    assert not any(tmp_path.iterdir())  # nothing was exported
    np.testing.assert_allclose(enc.encode(TEXTS[:4]), torch_encoder.encode(TEXTS[:4]), atol=1e-6)
    with pytest.raises(MissingDependency, match="onnxruntime"):
        Encoder.load(None, backend="onnx", cache_dir=tmp_path)


def test_in_place_weight_changes_switch_encoding_to_torch(cache_dir):
    import torch

    enc = Encoder.load(None, backend="exact", cache_dir=cache_dir)
    assert enc.backend_in_use == "onnx"
    before = enc.encode(["book a flight"])
    model = enc.model  # e.g. handed to a trainer
    with torch.no_grad():
        model[0].auto_model.embeddings.word_embeddings.weight.mul_(1.5)
    after = enc.encode(["book a flight"])
    assert enc.backend_in_use == "torch"
    want = model.encode(["book a flight"], convert_to_numpy=True, normalize_embeddings=True)
    np.testing.assert_allclose(after, want, atol=1e-6)
    assert float(after[0] @ before[0]) < 0.9999


def test_cache_key_follows_the_model_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"0" * 10)
    first = folder_fingerprint(tmp_path)
    assert folder_fingerprint(tmp_path) == first
    stat = (tmp_path / "model.safetensors").stat()
    os.utime(tmp_path / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert folder_fingerprint(tmp_path) != first


def test_unsupported_pooling_is_refused_with_a_reason(torch_encoder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling

    st = torch_encoder.model
    weighted = SentenceTransformer(modules=[st[0], Pooling(384, pooling_mode="weightedmean")], device="cpu")
    with pytest.raises(OnnxUnavailable, match="weightedmean"):
        pooling_spec(weighted)
    assert pooling_spec(st)["pooling"] == ["mean"]


@pytest.mark.slow
def test_cls_pooling_model_exports_exactly(tiny_model, tmp_path):
    """A model whose pooling config says CLS: the export reads it instead of assuming mean pooling (shown on
    the two-layer MiniLM of conftest: the pooling is what is tested, not the layers)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    mean_pooled = Encoder.load(tiny_model, backend="torch")
    st = mean_pooled.model
    cls_model = SentenceTransformer(modules=[st[0], Pooling(384, pooling_mode="cls"), Normalize()], device="cpu")
    folder = tmp_path / "cls-model"
    cls_model.save(str(folder))
    fast = Encoder.load(str(folder), backend="onnx", cache_dir=tmp_path / "cache")
    slow = Encoder.load(str(folder), backend="torch")
    assert fast.backend_in_use == "onnx"
    assert cosines(fast.encode(TEXTS), slow.encode(TEXTS)).min() >= 0.9999
    mean_vectors = mean_pooled.encode(TEXTS[:3])
    assert cosines(fast.encode(TEXTS[:3]), mean_vectors).max() < 0.999  # really CLS, not mean


def test_max_seq_length_override_truncates_like_torch(onnx_encoder, cache_dir):
    short_onnx = Encoder.load(None, backend="onnx", cache_dir=cache_dir, max_seq_length=32)
    short_torch = Encoder.load(None, backend="torch", max_seq_length=32)
    texts = [LONG, TEXTS[10], "book a flight"]
    got = short_onnx.encode(texts)
    assert cosines(got, short_torch.encode(texts)).min() >= 0.9999
    assert float(got[0] @ onnx_encoder.encode([LONG])[0]) < 0.9999  # really cut at 32, not 256


def test_few_torch_threads_uses_one_thread_for_small_cpu_batches_and_restores():
    torch = pytest.importorskip("torch")
    from toolscout.encoders import few_torch_threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with few_torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2  # restored
        with few_torch_threads(64):  # a real batch keeps every thread
            assert torch.get_num_threads() == 2
        with few_torch_threads(1, device="cuda"):  # GPU forwards are not ours to throttle
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError):
            with few_torch_threads(1):
                raise RuntimeError("forward failed")
        assert torch.get_num_threads() == 2  # restored after an error too
    finally:
        torch.set_num_threads(before)


def test_query_vectors_are_cached_and_a_changed_encoder_empties_the_cache():
    from toolscout.encoders.query_cache import QueryCache
    from toolscout.query import Query

    calls = []

    def compute(queries):
        calls.append([q.text for q in queries])
        return np.array([[float(len(q.text)), 1.0] for q in queries], dtype=np.float32)

    ab, abc, abcd = Query.of("ab"), Query.of("abc"), Query.of("abcd")
    cache = QueryCache(size=2)
    first = cache.vectors([ab, abc, ab], "k1", compute)
    assert calls == [["ab", "abc"]] and first.tolist() == [[2, 1], [3, 1], [2, 1]]
    cache.vectors([abc, abcd], "k1", compute)  # "abc" is a hit; "abcd" pushes out "ab" (least recent)
    assert calls[-1] == ["abcd"] and (cache.hits, cache.misses) == (1, 4)  # a repeat within one call is a miss
    cache.vectors([ab], "k1", compute)
    assert calls[-1] == ["ab"]
    cache.vectors([ab], "k2", compute)  # another encoder state: nothing cached counts
    assert calls[-1] == ["ab"] and len(calls) == 4
    cache.vectors([Query.of("xab").part("ab")], "k2", compute)  # the same words cut from a task: its own entry
    assert calls[-1] == ["ab"] and len(calls) == 5
    transcript = "user: book a flight for me\nassistant: where to?\nuser: to Oslo please"
    chat = Query.of(transcript)  # its latest user turn weighs in its vector
    assert chat.text == transcript and chat.latest_turn == "user: to Oslo please"
    cache.vectors([Query(transcript)], "k2", compute)  # the same text read whole: not the transcript's vector
    cache.vectors([chat], "k2", compute)
    assert calls[-2:] == [[transcript], [transcript]]


def test_the_encoder_answers_repeated_queries_from_its_cache(encoder):
    from toolscout.query import as_queries

    queries = ["book a flight to Oslo", "send an email to Ann"]
    fresh = encoder._encode_queries(as_queries(queries))
    hits = encoder.query_cache.hits
    np.testing.assert_array_equal(encoder.encode_queries(queries), fresh)
    np.testing.assert_array_equal(encoder.encode_queries(queries[::-1]), fresh[::-1])
    assert encoder.query_cache.hits == hits + 2  # the second call was served from the cache


@pytest.mark.slow  # runs the quality check's evaluation
def test_int8_is_used_only_for_a_model_whose_recorded_quality_check_passed(tmp_path, tiny_model, monkeypatch):
    """auto picks onnx-int8 for a model folder whose recorded check passed, float32 otherwise (no record,
    a failed check, or a recorded delta beyond the tolerance); an index searches with what built it. The
    folder is the two-layer MiniLM of conftest: any model folder's record is read alike."""
    import shutil

    from toolscout.encoders import PROBE_TEXTS, Encoder
    from toolscout.encoders.quality import TOLERANCE, record, verdict

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    cache = tmp_path / "onnx"
    orphan = cache / "trained-onnx-0123"  # an export of a model folder deleted since: the next export removes it
    orphan.mkdir(parents=True)
    (orphan / "source.json").write_text(json.dumps({"folder": str(tmp_path / "deleted"), "state": "0"}))
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx"  # never checked
    assert not orphan.exists()
    failed = verdict({"a": 50.0, "b": 60.0}, {"a": 49.0, "b": 60.2})  # macro moves by -0.4
    assert failed["passed"] is False and failed["macro_delta"] == pytest.approx(-0.4)
    record(folder, failed)
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx"
    int8_probes = Encoder.load(str(folder), cache_dir=cache, backend="onnx-int8").encode(list(PROBE_TEXTS))
    passed = verdict({"a": 50.0, "b": 60.0}, {"a": 49.9, "b": 60.2}, probe_vectors=int8_probes)  # +0.05
    assert passed["passed"] is True and abs(passed["macro_delta"]) < TOLERANCE
    record(folder, {key: value for key, value in passed.items() if key != "probe_vectors"})
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx"  # not tied to an encoding
    record(folder, passed)
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx-int8"
    # a check of another encoding (here float32's vectors: worst probe cosine ~0.996 to int8's for this model,
    # under the 0.999 that means the same encoding) does not vouch for this one
    exact_probes = Encoder.load(str(folder), cache_dir=cache, backend="onnx").encode(list(PROBE_TEXTS))
    record(folder, verdict({"a": 50.0, "b": 60.0}, {"a": 49.9, "b": 60.2}, probe_vectors=exact_probes))
    elsewhere = Encoder.load(str(folder), cache_dir=cache)
    assert elsewhere.backend_in_use == "onnx" and "not the one whose quality was checked" in elsewhere.fallback_reason
    # the machine keeps each verdict: a later start neither probes again nor, for a verdict against int8, loads it
    loaded = []
    load_onnx = Encoder._load_onnx
    monkeypatch.setattr(Encoder, "_load_onnx", lambda self, variant: loaded.append(variant) or load_onnx(self, variant))
    monkeypatch.setattr("toolscout.encoders.same_encoding", lambda *a: pytest.fail("probed again"))
    again = Encoder.load(str(folder), cache_dir=cache)
    assert again.backend_in_use == "onnx" and again.fallback_reason == elsewhere.fallback_reason and loaded == ["onnx"]
    record(folder, passed)  # the check probed (and passed) above: its verdict too is kept
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx-int8" and loaded[-1] == "onnx-int8"
    monkeypatch.undo()
    assert Encoder.load(str(folder), cache_dir=cache, backend="exact").backend_in_use == "onnx"
    # an index built with int8 records it, and is searched with int8 whatever the model's record says later
    from toolscout.retrievers.dense import DenseRetriever
    from toolscout.tool import Tool

    int8 = Encoder.load(str(folder), cache_dir=cache)
    retriever = DenseRetriever(encoder=int8, summary_weight=0.0)
    retriever.index([Tool("a", "send_email", "Send an email"), Tool("b", "get_weather", "Weather forecast")])
    retriever.save(tmp_path / "index")
    forged = {**passed, "macro_delta": 0.31}  # a record claiming "passed" beyond the tolerance is not trusted
    record(folder, forged)
    assert Encoder.load(str(folder), cache_dir=cache).backend_in_use == "onnx"
    reloaded = DenseRetriever.load(tmp_path / "index")
    assert reloaded.encoder.backend_in_use == "onnx-int8"
    assert reloaded.search(["mail to Bob"], 1).ids[0][0] == "a"
    # recording checks changed nothing an export is made from: one export per encoding, made once
    assert len(list(cache.glob("*-onnx-int8-*"))) == 1 and len(list(cache.glob("*-onnx-*"))) == 2
    # each records the folder it was made from, so that it goes when the folder does (test above)
    for export in cache.glob("*-onnx-*"):
        assert json.loads((export / "source.json").read_text())["folder"] == str(folder.resolve())


def test_exports_of_a_model_folder_gone_or_saved_over_are_removed_from_the_cache(tmp_path):
    from toolscout.encoders.cache import SOURCE_FILE, folder_state, prune_stale_exports

    cache = tmp_path / "onnx"
    models = {name: tmp_path / name for name in ("kept", "deleted", "retrained")}
    for folder in models.values():
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")
    for name, folder in models.items():
        export = cache / f"{name}-onnx-0123"
        export.mkdir(parents=True)
        (export / "model.onnx").write_bytes(b"graph")
        (export / SOURCE_FILE).write_text(json.dumps({"folder": str(folder), "state": folder_state(folder)}))
    (cache / "hub-model-onnx-4567").mkdir()  # recorded no folder: stays
    writing = cache / ".deleted-onnx-89ab.tmp"  # an export being written: stays
    writing.mkdir()
    (writing / SOURCE_FILE).write_text((cache / "deleted-onnx-0123" / SOURCE_FILE).read_text())
    assert prune_stale_exports(cache) == []  # every folder as it was exported
    (models["deleted"] / "model.safetensors").unlink()
    models["deleted"].rmdir()
    (models["retrained"] / "model.safetensors").write_bytes(b"new weights")  # saved over: another key now
    assert prune_stale_exports(cache) == [cache / "deleted-onnx-0123", cache / "retrained-onnx-0123"]
    assert sorted(p.name for p in cache.iterdir()) == [".deleted-onnx-89ab.tmp", "hub-model-onnx-4567",
                                                       "kept-onnx-0123"]


@pytest.mark.slow  # exports and quantises a model
def test_int8_encodes_each_text_alone_so_a_vector_does_not_depend_on_its_batch(cache_dir):
    """int8 activations are quantised with one scale per tensor: in a shared batch a text's vector would
    move with the texts beside it (cosine ~0.99). Each text runs alone, so batches give the same rows."""
    int8 = Encoder.load(None, backend="onnx-int8", cache_dir=cache_dir)
    assert int8._onnx.per_text
    alone = np.concatenate([int8.encode([t]) for t in TEXTS])
    np.testing.assert_array_equal(int8.encode(TEXTS, batch_size=64), alone)
    np.testing.assert_array_equal(int8.encode(TEXTS[::-1], batch_size=3), alone[::-1])
    exact = Encoder.load(None, backend="onnx", cache_dir=cache_dir)
    assert not exact._onnx.per_text  # float32 batches are exact (padding is masked out)


def test_a_long_int8_text_alone_runs_on_every_core_with_the_same_vector(cache_dir, monkeypatch):
    """A long task encoded alone gets a session with every core (latency); its vector is exactly the
    single-threaded one, so where a text was encoded (a batch, a pool, alone) never changes it."""
    monkeypatch.setattr("toolscout.encoders.onnx_runtime.usable_cores", lambda: 2)
    int8 = Encoder.load(None, backend="onnx-int8", cache_dir=cache_dir)
    onnx = int8._onnx
    long_text = "find the tool that converts this long invoice into a spreadsheet row " * 12
    long_encoding = onnx.tokenizer.encode(long_text)
    assert len(long_encoding.ids) >= onnx.WIDE_FROM_TOKENS
    wide = onnx.session_for(long_encoding)
    assert wide is not onnx.session
    assert onnx.session_for(onnx.tokenizer.encode("mail Bob")) is onnx.session  # short texts keep one thread
    single = onnx.session.run(["embedding"], onnx._feeds([long_encoding]))[0]
    np.testing.assert_array_equal(int8.encode([long_text]), single)
    pooled = int8.encode([long_text] + TEXTS * 8)  # 16+ texts: the one-thread pool
    np.testing.assert_array_equal(pooled[:1], single)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity (Linux) and two cores this process may use")
def test_an_int8_encoder_allowed_one_core_of_several_uses_one_thread(cache_dir):
    """Sized by the cores the process may run on (a container's or taskset's CPU set), not the machine's: with
    every core counted, one allowed core ran a pool of workers and a wide session for long texts."""
    import subprocess

    script = ("import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
              "from toolscout.encoders import Encoder; "
              "onnx = Encoder.load(None, backend='onnx-int8', cache_dir=sys.argv[1])._onnx; "
              "print(onnx.workers, onnx._wide)")
    done = subprocess.run([sys.executable, "-c", script, str(cache_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "None"]


def test_the_release_step_keeps_a_benchmarks_verdict_with_the_model_and_refuses_anything_else(tmp_path):
    """scripts/record_quality_check.py writes a quantization/query-student `--json` verdict where
    `backend="auto"` reads it (`quality.recorded`); a file that is not a verdict changes nothing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from toolscout.encoders.quality import recorded, verdict

    script = Path(__file__).resolve().parents[1] / "scripts" / "record_quality_check.py"
    folder = tmp_path / "model"
    folder.mkdir()
    check = verdict({"a": 50.0}, {"a": 50.1}, probe_vectors=np.eye(3, dtype=np.float32))
    good = tmp_path / "check.json"
    good.write_text(json.dumps(check))
    done = subprocess.run([sys.executable, script, good, "--model", folder], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert recorded(folder) == check
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps({"per_set": {"a": 1.0}}))  # an eval report, not a verdict
    done = subprocess.run([sys.executable, script, bad, "--model", folder], capture_output=True, text=True)
    assert done.returncode == 2 and "report.json: not a quality check's verdict (no passed, probe_vectors)" in done.stderr
    assert recorded(folder) == check  # what was kept is untouched


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="verdicts are kept only where the CPU is described")
def test_a_kept_int8_verdict_holds_only_for_the_export_and_check_it_was_reached_on(tmp_path):
    """A verdict kept for one int8 export must not vouch for another (weights retrained and exported again,
    reviewer session 20): it is keyed by the export's file and the recorded check; a damaged verdict is none."""
    from toolscout.encoders.quality import VERDICTS, keep_verdict, kept_verdict, machine_key

    cache, export = tmp_path / "cache", tmp_path / "model-onnx-int8-0123"
    export.mkdir()
    (export / "model.onnx").write_bytes(b"graph one")
    check = {"probe_vectors": "2x2:AAAAAAAAAAA="}
    assert kept_verdict(cache, check, export) is None  # nothing kept yet
    keep_verdict(cache, check, export, True, 0.9995)
    assert kept_verdict(cache, check, export) == (True, 0.9995)
    assert kept_verdict(cache, {"probe_vectors": "another check"}, export) is None
    (export / "model.onnx").write_bytes(b"graph two, exported again")  # a new export in the same folder
    assert kept_verdict(cache, check, export) is None
    assert kept_verdict(cache, check, tmp_path / "no-export-yet") is None
    key = machine_key(check, export)
    (cache / VERDICTS / f"{key}.json").write_text('{"same": "false", "worst": 0.5}')  # not a verdict toolscout wrote
    assert kept_verdict(cache, check, export) is None
    keep_verdict(cache, check, export, False, 0.9677)
    assert kept_verdict(cache, check, export) == (False, 0.9677)
    assert not [p.name for p in (cache / VERDICTS).iterdir() if not p.name.endswith(".json")]  # no temporary file


def test_a_process_exporting_a_model_another_is_exporting_waits_for_it_and_says_so(tmp_path, caplog):
    """Replicas and test workers start together; each exported the same model. The second waits on the
    export's lock, and logs that it waits (it logged nothing, and a slow start looked hung)."""
    from toolscout.encoders.cache import export_lock

    target = tmp_path / "model-export"
    (tmp_path / ".locks").mkdir()
    holder = os.open(tmp_path / ".locks" / "model-export.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process's export, in progress
    entered = threading.Event()

    def second():
        with export_lock(tmp_path, target):
            entered.set()

    waiter = threading.Thread(target=second, daemon=True)  # a failure below must not leave it holding the run
    try:
        with caplog.at_level("WARNING", logger="toolscout"):  # a server's default level shows it
            waiter.start()
            deadline = time.time() + 30
            while "another process is exporting model-export; waiting for it" not in caplog.text:
                assert time.time() < deadline, "the second export neither waited nor said so"
                time.sleep(0.01)  # polling interval: what is awaited is the log line
            assert not entered.wait(0.2)  # it does not pass the lock while the first export holds it
    finally:
        os.close(holder)  # the first export done
    waiter.join(30)
    assert entered.is_set() and not waiter.is_alive()

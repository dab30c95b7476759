"""The fast tier: tasks encoded by a static table distilled from the default encoder (`encoders/static.py`),
tools and learning left to the encoder. Sums worked out by hand, the shipped table against the vectors
its fitting run recorded, and a real server started with --fast-queries."""

import json
from pathlib import Path

import numpy as np
import pytest
from servers import served_search
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from toolscout import ToolScout
from toolscout.encoders import static
from toolscout.encoders.query_cache import QueryCache
from toolscout.retrievers.base import Encoding, parts


def word_tokenizer() -> Tokenizer:
    tok = Tokenizer(WordLevel({"[UNK]": 0, "book": 1, "flight": 2, "hotel": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok


ROWS = np.array([[0, 0, 0], [1, 0, 0], [0, 2, 0], [0, 0, 3]], dtype=np.float32)
BIAS = np.array([0, 0, 1], dtype=np.float32)


def test_a_task_is_the_normalised_sum_of_its_rows_and_the_bias():
    table = static.StaticTable(ROWS, BIAS, word_tokenizer(), max_tokens=2)
    got = table.encode(["book flight", "", "book flight hotel", "zebra"])
    np.testing.assert_allclose(got[0], np.array([1, 2, 1]) / np.sqrt(6), rtol=1e-6)  # (1,0,0)+(0,2,0)+bias
    np.testing.assert_allclose(got[1], [0, 0, 1])  # no word pieces: the bias alone
    np.testing.assert_allclose(got[2], np.array([1, 2, 1]) / np.sqrt(6), rtol=1e-6)  # cut after two pieces
    np.testing.assert_allclose(got[3], [0, 0, 1])  # [UNK]'s row is zero here


def test_a_table_that_does_not_fit_its_tokenizer_is_refused():
    with pytest.raises(static.StaticTableError, match="does not fit a tokenizer of 4"):
        static.StaticTable(ROWS[:3], BIAS, word_tokenizer(), max_tokens=8)


def test_a_written_table_keeps_its_rows_to_int8_rounding_and_records_its_own_vectors(tmp_path):
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 3)).astype(np.float32)
    info = {"teacher": "t", "teacher_digest": "0" * 64, "max_tokens": 8}
    static.write_table(tmp_path, rows, BIAS, info, ["book hotel", "flight"], word_tokenizer())
    loaded = static.load_table(tmp_path, word_tokenizer(), info)
    step = np.abs(rows).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(loaded.rows - rows) <= step / 2 + 1e-7)
    reference = np.load(tmp_path / static.REFERENCE)
    expected = rows[[1, 3]].sum(0) + BIAS
    np.testing.assert_allclose(reference["vectors"][0], expected / np.linalg.norm(expected), atol=0.02)
    np.testing.assert_allclose(reference["vectors"], loaded.encode(list(reference["texts"])), atol=1e-7)


# ------------------------------------------------------------------- the shipped table

@pytest.fixture(scope="module")
def fast(encoder):
    """The shipped table over the default encoder (the `encoder` fixture)."""
    return static.static_queries_for(encoder)


@pytest.mark.parametrize("tier", ["encoder", "table"])
def test_each_query_encoder_honours_the_contract_and_reads_the_latest_turn_off_the_query(tier, encoder, fast,
                                                                                         monkeypatch):
    from toolscout.encoders.contract import QueryEncoder
    from toolscout.query import Query

    query_encoder = encoder if tier == "encoder" else fast
    monkeypatch.setattr(query_encoder, "query_cache", QueryCache(0))  # every call encodes
    transcript = "User: book a flight to Rome\nAI: done\nUser: and a hotel near the station"
    tasks = ["send an email to my boss", transcript]
    assert isinstance(query_encoder, QueryEncoder)
    as_text = query_encoder.encode_queries(tasks)
    assert as_text.shape == (2, query_encoder.dim) and as_text.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(as_text, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(as_text, query_encoder.encode_queries([Query.of(t) for t in tasks]))
    # the latest turn is what the query carries, not found again: without it, the transcript is plain text
    plain = query_encoder.encode_queries([Query(transcript)])[0]
    assert float(plain @ as_text[1]) < 0.99
    own = encoder.encode([transcript])[0] if tier == "encoder" else fast.table.encode([transcript])[0]
    np.testing.assert_allclose(plain, own, atol=1e-6)


@pytest.mark.parametrize("tier", ["encoder", "table"])
def test_each_query_encoder_reads_a_long_transcript_by_its_recent_turns(tier, encoder, fast, monkeypatch):
    query_encoder = encoder if tier == "encoder" else fast
    monkeypatch.setattr(query_encoder, "query_cache", QueryCache(0))
    own = encoder.encode if tier == "encoder" else fast.table.encode
    older = "User: " + "tell me about the weather in Paris and in Rome " * 14  # 664 characters: past the window
    recent, tail = "AI: It is sunny.\nUser: now send an email to my wife", "User: now send an email to my wife"
    got = query_encoder.encode_queries([f"{older}\n{recent}"])[0]
    context_vector, tail_vector = own([recent, tail])
    expected = context_vector + tail_vector
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected), atol=1e-5)


def test_the_shipped_table_gives_the_vectors_its_fitting_run_recorded(fast, encoder):
    reference = np.load(static.STATIC_DIR / encoder.name / static.REFERENCE)
    texts = list(reference["texts"])
    np.testing.assert_allclose(fast.table.encode(texts), reference["vectors"], atol=1e-6)
    tasks = [t for t in texts if len(t.split()) >= 3]  # the probes that read like tasks (not "", "a", ...)
    cosines = np.sum(fast.table.encode(tasks) * encoder.encode(tasks), axis=1)
    # distilled: close to the encoder's own vectors (the pieces' start vectors summed give ~0.26)
    assert len(tasks) >= 6 and float(cosines.min()) > 0.7, cosines


def test_a_table_fitted_to_other_weights_or_another_encoder_is_refused(tmp_path):
    class Other:
        name, dim = "toolscout-tools", 384
        path = str(tmp_path)

    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(static.StaticTableError, match="distilled from other weights"):
        static.static_queries_for(Other())
    Other.name = "my-model"
    with pytest.raises(static.StaticTableError, match="ships one for: toolscout-tools"):
        static.static_queries_for(Other())


def test_fast_queries_rank_by_the_table_while_tools_and_learning_keep_the_encoder(tools, encoder, fast, monkeypatch):
    scout = ToolScout.from_tools(tools, encoder=encoder)
    dense = next(part for part in parts(scout.retriever) if isinstance(part, Encoding))
    every = [t.id for t in tools]
    stored = dense.store.get(every)
    task = "send an email to my team about the flight"
    encoder_scores = dense.search([task], k=3).scores[0]
    assert scout.fast_queries is None
    scout.use_fast_queries()
    assert scout.fast_queries == "table" and dense.query_encoder is not None
    ids, scores = dense.search([task], k=3)[0]
    vector = fast.table.encode([task])[0]
    by_hand = {tid: float(stored[every.index(tid)] @ vector) for tid in ids}
    np.testing.assert_allclose(scores, [by_hand[t] for t in ids], rtol=1e-5)
    assert not np.allclose(scores, encoder_scores)  # not the encoder's query vector
    np.testing.assert_array_equal(dense.store.get(every), stored)  # the tools' vectors are the encoder's
    from toolscout.learning.space import space_for

    monkeypatch.setattr(encoder, "query_cache", QueryCache(0))  # the shared encoder's cache comes back after
    learned = space_for(scout.retriever).requests([task])[0]  # what learning compares requests in
    np.testing.assert_allclose(learned, encoder.encode_queries([task])[0], atol=1e-6)
    assert not np.allclose(learned, vector / np.linalg.norm(vector), atol=1e-3)  # not the table's


def test_fast_queries_need_a_dense_retriever(tools):
    from toolscout.encoders.fast import FastQueriesUnavailable

    for tier in ("table", "student"):
        with pytest.raises(FastQueriesUnavailable, match="retriever is 'bm25'"):
            ToolScout.from_tools(tools, retriever="bm25").use_fast_queries(tier)
    with pytest.raises(ValueError, match="unknown fast-queries tier 'fastest'"):
        ToolScout.from_tools(tools, retriever="bm25").use_fast_queries("fastest")


@pytest.mark.slow  # starts a server
def test_a_server_started_with_fast_queries_ranks_by_the_table(tmp_path, tools, encoder):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, encoder=encoder).save(folder)
    task = "convert the attached document to pdf and mail it"
    expected = [(h.tool.id, h.score) for h in ToolScout.load(folder, fast_queries=True).search(task, k=4)]
    default = [(h.tool.id, h.score) for h in ToolScout.load(folder).search(task, k=4)]
    assert expected != default
    health, hits = served_search([str(folder), "--fast-queries", "--no-fsync"], task, k=4)
    assert health["fast_queries"] is True
    assert [h["id"] for h in hits] == [t for t, _ in expected]
    np.testing.assert_allclose([h["score"] for h in hits], [s for _, s in expected], rtol=1e-5)


@pytest.mark.slow  # starts PostgreSQL
def test_the_postgresql_store_serves_fast_queries_too(tmp_path, tools, encoder):
    from pgtest import new_table, postgres_uri, spec

    from toolscout.postgres import migrate_directory
    from toolscout.serve import ToolService

    ToolScout.from_tools(tools, retriever="dense", encoder=encoder).save(tmp_path / "local")
    store_spec = spec(postgres_uri(), new_table())
    migrate_directory(tmp_path / "local", store_spec)
    task = "which flights leave for Oslo tomorrow"
    local = ToolScout.load(tmp_path / "local", fast_queries=True).retrieve([task], 4)
    with ToolService.open(store_spec, encoder=encoder, batch_workers=0, fast_queries=True) as service:
        assert service.stats()["fast_queries"] is True
        hits = service.search(task, k=4, min_score=None, match_names=False)
    assert [h.tool.id for h in hits] == list(local.ids[0])
    np.testing.assert_allclose([h.score for h in hits], local.scores[0], rtol=1e-4)
    with ToolService.open(store_spec, encoder=encoder, batch_workers=0) as service:
        assert service.stats()["fast_queries"] is False
        assert not np.allclose([h.score for h in service.search(task, k=4, min_score=None, match_names=False)],
                               local.scores[0])


def test_the_cli_searches_and_evaluates_with_fast_queries(tmp_path, tools, encoder, capsys):
    from toolscout.cli import main

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, encoder=encoder).save(folder)
    task = "convert the attached document to pdf and mail it"
    expected = [h.score for h in ToolScout.load(folder, fast_queries=True).search(task, k=3)]
    scores = {}
    for flags in ((), ("--fast-queries",)):
        assert main(["search", str(folder), task, "-k", "3", "--json", *flags]) == 0
        scores[flags] = [h["score"] for h in json.loads(capsys.readouterr().out)["hits"]]
    np.testing.assert_allclose(scores[("--fast-queries",)], expected, rtol=1e-5)
    assert not np.allclose(scores[()], expected)
    eval_set = Path(__file__).parent / "fixtures" / "eval"
    sets = sorted(p for p in eval_set.iterdir() if (p / "tools.jsonl").exists())[:1]
    assert main(["eval", *map(str, sets), "--retriever", "bm25", "--fast-queries", "--quiet"]) == 1
    assert "retriever is 'bm25'" in capsys.readouterr().err  # the flag reaches the pipeline eval builds


def test_the_tier_is_saved_with_the_index_and_used_wherever_it_is_loaded(tmp_path, tools, encoder, capsys):
    """`toolscout index --fast-queries` records the route: `load`, `search` and `serve` encode tasks
    through the table without being told, `--encoder-queries` / fast_queries=False override it, and an
    index saved before the route was recorded still uses the encoder."""
    from toolscout.cli import main
    from toolscout.spec import read_pipeline_config

    catalog = Path(__file__).resolve().parents[1] / "src/toolscout/data/catalogs/mcp_reference_servers.json"
    folder = tmp_path / "idx"
    assert main(["index", str(catalog), "--out", str(folder), "--fast-queries"]) == 0
    assert "tasks through the static table" in capsys.readouterr().err
    assert read_pipeline_config(folder)[1]["fast_queries"] == "table"
    saved = ToolScout.load(folder)
    assert saved.fast_queries == "table" and ToolScout.load(folder, fast_queries=False).fast_queries is None
    task = "what time is it in Tokyo"
    table = [h.score for h in saved.search(task, k=3)]
    own = [h.score for h in ToolScout.load(folder, fast_queries=False).search(task, k=3)]
    assert not np.allclose(table, own)
    for flags, expected in (((), table), (("--encoder-queries",), own)):
        assert main(["search", str(folder), task, "-k", "3", "--json", *flags]) == 0
        np.testing.assert_allclose([h["score"] for h in json.loads(capsys.readouterr().out)["hits"]], expected,
                                   rtol=1e-5)
    with pytest.raises(SystemExit):  # a fresh index has no saved tier to override
        main(["index", str(catalog), "--out", str(tmp_path / "x"), "--encoder-queries"])
    older = tmp_path / "older"
    ToolScout.from_tools(saved.tools, encoder=encoder).save(older)
    assert ToolScout.load(older).fast_queries is None
    # a tier given where an index is read is for that process: saving again (a server's compaction)
    # keeps the tier the directory had
    ToolScout.load(folder, fast_queries=False).save(folder)
    ToolScout.load(older, fast_queries="table").save(older)
    assert (ToolScout.load(folder).fast_queries, ToolScout.load(older).fast_queries) == ("table", None)

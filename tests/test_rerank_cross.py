"""Tool-Rank cross-encoder (`toolscout train cross`, `rerank.cross`): negatives, a tiny real run, reloading,
the reranking contract and errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from toolscout.artifacts import ArtifactError, write_artifact
from toolscout.benchmark_sets import Query, load_benchmark
from toolscout.cli import main
from toolscout.models import model_base
from toolscout.rerank.base import RERANKER_KIND, fuse_with_first_stage, load_reranker, zscores
from toolscout.rerank.cross import CrossEncoderReranker, encode_pairs, load_pair_model
from toolscout.results import Results
from toolscout.retrievers.base import make_retriever
from toolscout.tool import Tool
from toolscout.train.cross import (
    FUSION_WEIGHTS,
    PairLoss,
    base_model_path,
    first_stage_runs,
    fit_cross,
    group_batches,
    hard_count,
    make_groups,
)
from toolscout.train.data import TrainingData, load_training_data
from toolscout.train.embed import RandomNegatives, epoch_examples, tool_sets, training_pairs
from toolscout.train.loop import TrainConfig, set_seed

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
TINY = {"first_stage": "bm25", "max_length": 64, "max_validation": 8, "rerank_depth": 10}


# slow: trains; trained models encode with torch (conftest)
pytestmark = [pytest.mark.usefixtures("torch_encoders"), pytest.mark.slow]


@pytest.fixture(scope="module")
def sample_data() -> TrainingData:
    return load_training_data([SAMPLE], validation_fraction=0.2)


@pytest.fixture(scope="module")
def sample_tools() -> dict[str, Tool]:
    return {t.id: t for t in load_benchmark(SAMPLE).tools}


# ------------------------------------------------------------------------------------- negatives


def two_set_data() -> TrainingData:
    def tool(tid, text):
        return Tool(tid, tid.split("::")[1], text)

    tools = [tool("a::weather", "weather forecast for a city"), tool("a::rain", "rain and weather radar"),
             tool("a::wind", "wind speed weather"), tool("a::mail", "send an email"),
             tool("a::cal", "calendar events"), tool("a::notes", "write a note"),
             tool("b::flight", "book a flight ticket"), tool("b::hotel", "book a hotel room"),
             tool("b::car", "rent a car"), tool("b::train", "train tickets booking"),
             tool("b::taxi", "call a taxi"), tool("b::visa", "visa requirements")]
    train = [Query("q1", "weather forecast in Paris", ("a::weather",)),
             Query("q2", "rain, wind and the weather today", ("a::rain", "a::wind")),
             Query("q3", "book a flight and a hotel", ("b::flight", "b::hotel")),
             Query("q4", "book train tickets", ("b::train",))]
    validation = [Query("v1", "weather radar", ("a::rain",)), Query("v2", "book a taxi", ("b::taxi",))]
    return TrainingData({t.id: t for t in tools}, train, validation, ["a", "b"])


def test_hard_negatives_come_from_the_own_set_and_are_never_gold():
    data = two_set_data()
    sets = tool_sets(data)
    validation = {"a": [data.validation[0]], "b": [data.validation[1]]}
    pools, candidates = first_stage_runs(data, "bm25", sets, depth=30, rerank_depth=4, validation=validation)
    assert set(pools) == {0, 1, 2, 3}
    for qi, pool in pools.items():
        query = data.train[qi]
        own = sets[query.labels[0]]
        assert pool and not set(pool) & set(query.labels)  # gold tools never count as negatives
        assert all(sets[t] == own for t in pool)  # indexed per set: only tools the query is ranked against
        assert len(pool) <= 6 - len(query.labels)  # BM25 returns only tools sharing a word with the query
    ids_a, scores_a = candidates["a"][0]
    assert all(t.startswith("a::") for t in ids_a) and 0 < len(ids_a) <= 4 and len(scores_a) == len(ids_a)
    assert scores_a == sorted(scores_a, reverse=True)  # first-stage scores, best first
    assert all(t.startswith("b::") for t in candidates["b"][0][0])

    pairs = training_pairs(data.train, frozenset(data.tools))
    sampler = RandomNegatives(list(data.tools), groups=sets)
    polluted = {qi: list(data.train[qi].labels) + pool for qi, pool in pools.items()}  # a gold tool slipped in
    for epoch in range(3):
        groups = make_groups(pairs, data.train, polluted, sampler, negatives=3, hard_fraction=0.5, seed=0, epoch=epoch)
        assert len(groups) == len(pairs)
        for ex in groups:
            gold = set(data.train[ex.query].labels)
            assert len(ex.negatives) == 3 and len(set(ex.negatives)) == 3
            assert not set(ex.negatives) & gold
            assert all(sets[n] == sets[ex.tool] for n in ex.negatives)
            mined = min(hard_count(3, 0.5), len(pools[ex.query]))  # a short pool is topped up with random ones
            assert set(ex.negatives[:mined]) <= set(pools[ex.query])
    again = make_groups(pairs, data.train, pools, sampler, 3, 0.5, seed=0, epoch=1)
    assert again == make_groups(pairs, data.train, pools, sampler, 3, 0.5, seed=0, epoch=1)  # resumable


def test_hard_share_and_pair_batches():
    assert [hard_count(3, f) for f in (0.0, 0.34, 0.5, 1.0)] == [0, 1, 2, 3]
    groups = list(range(10))
    assert [len(b) for b in group_batches(groups, batch_size=16, negatives=3)] == [4, 4, 2]  # 16 pairs = 4 groups
    assert [len(b) for b in group_batches(groups, batch_size=2, negatives=3)] == [1] * 10  # at least one group


def test_base_model_is_the_packaged_minilm_transformer():
    name, path = base_model_path(None)
    assert name == "default" and (Path(path) / "config.json").exists()


# ------------------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def trained(sample_data, tmp_path_factory, tiny_model):
    """A tiny real run: 8 steps of 8 pairs on the bundled API-Bank sample (BM25 first stage), from the
    two-layer MiniLM (conftest)."""
    out = tmp_path_factory.mktemp("cross") / "model"
    config = TrainConfig(max_steps=8, batch_size=8, lr=1e-4, progress=False, seed=0)
    sets = tool_sets(sample_data)
    pairs = training_pairs(sample_data.train, frozenset(sample_data.tools))
    pools, _ = first_stage_runs(sample_data, "bm25", sets, depth=30, rerank_depth=10, validation={})
    examples = epoch_examples(pairs, [sets.get(t, "") for _q, t in pairs], "sets", seed=5, epoch=0)
    probe = make_groups(examples[:6], sample_data.train, pools, RandomNegatives(list(sample_data.tools), sets),
                        3, 0.5, seed=5, epoch=0)  # 24 fixed pairs

    def probe_loss(tokenizer, net) -> float:
        from toolscout.tool import tool_text

        docs = {tid: tool_text(t) for tid, t in sample_data.tools.items()}
        net.eval()
        with torch.no_grad():
            return PairLoss(net, tokenizer, sample_data.train, docs, 64, "cpu")(probe).item()

    _, base = base_model_path(tiny_model)
    set_seed(0)  # the same fresh head the run starts from
    before = probe_loss(*load_pair_model(base))
    summary = fit_cross(sample_data, out, model=tiny_model, config=config, **TINY)
    from toolscout.models import model_config

    folder, model_cfg = model_config(out, method="cross")
    tokenizer, net = load_pair_model(folder / "model")
    return {"out": out, "summary": summary, "before": before, "after": probe_loss(tokenizer, net),
            "tokenizer": tokenizer, "net": net, "config": model_cfg}


def test_training_lowers_the_loss_and_records_the_run(trained):
    assert trained["after"] < trained["before"]
    summary = trained["summary"]
    assert summary.steps == 8 and summary.examples == 64  # 8 steps of 2 groups x 4 pairs
    assert summary.best_validation is not None and "first_stage_validation" in summary.data
    assert summary.data["hard_negatives_per_pair"] == 2
    config = trained["config"]
    assert config["method"] == "cross" and config["max_length"] == 64 and config["depth"] == 10
    assert not trained["out"].with_name(trained["out"].name + ".checkpoint").exists()  # finish() cleaned up


def _candidates(tools, queries, k=10):
    retriever = make_retriever("bm25")
    retriever.index(list(tools.values()))
    return retriever.search(queries, k)


QUERIES = ["User: Can you check my health data from last week?",
           "User: I want to cancel my appointment with Dr. Smith.",
           "User: What's the weather tomorrow?"]


def test_training_picks_the_fusion_weight_on_validation(trained):
    data, config = trained["summary"].data, trained["config"]
    by_weight = data["validation_by_first_stage_weight"]
    assert set(by_weight) == {str(w) for w in FUSION_WEIGHTS}
    best = max(by_weight.values())
    chosen = min(float(w) for w, v in by_weight.items() if v == best)  # ties go to the smaller weight
    assert config["first_stage_weight"] == data["first_stage_weight"] == chosen
    assert data["reranker_alone_validation"] == by_weight["0.0"]


def test_fusion_mixes_standardised_scores():
    own, first = np.array([2.0, 0.0, -2.0]), np.array([0.1, 0.3, 0.2])
    # z(own) = [1.2247, 0, -1.2247]; z(first) = [-1.2247, 1.2247, 0]
    np.testing.assert_allclose(zscores(own), [1.224745, 0.0, -1.224745], atol=1e-6)
    np.testing.assert_allclose(fuse_with_first_stage(own, first, 0.25),
                               [0.75 * 1.224745 - 0.25 * 1.224745, 0.25 * 1.224745, -0.75 * 1.224745], atol=1e-6)
    np.testing.assert_array_equal(fuse_with_first_stage(own, first, 0.0), own)  # weight 0: untouched
    np.testing.assert_array_equal(zscores([3.0, 3.0]), [0.0, 0.0])  # no spread: no information
    with pytest.raises(ValueError, match="first_stage_weight"):
        fuse_with_first_stage(own, first, 1.5)


def test_saved_model_reloads_with_the_same_scores(trained, sample_tools, tmp_path):
    reranker = load_reranker(trained["out"])
    assert isinstance(reranker, CrossEncoderReranker) and reranker.depth == 10 and reranker.max_length == 64
    assert reranker.first_stage_weight == trained["config"]["first_stage_weight"]
    pure = load_reranker(trained["out"], first_stage_weight=0.0)
    fused = load_reranker(trained["out"], first_stage_weight=0.5)
    candidates = _candidates(sample_tools, QUERIES)
    got = reranker.rerank(QUERIES, candidates, sample_tools)
    # the in-memory model, pair by pair, without the reranker's batching
    tokenizer, net = trained["tokenizer"], trained["net"]
    for query, (ids, scores), (fused_ids, fused_scores), (first_ids, first_scores) in zip(
            QUERIES, pure.rerank(QUERIES, candidates, sample_tools), fused.rerank(QUERIES, candidates, sample_tools),
            candidates):
        docs = [reranker.tool_text(sample_tools[t]) for t in ids]
        with torch.no_grad():
            logits = net(**encode_pairs(tokenizer, [query] * len(ids), docs, 64)).logits[:, 0].numpy()
        np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits)), atol=1e-5)  # weight 0: P(relevant)
        # weight 0.5: half the z-scored logit, half the z-scored BM25 score, for the same tool
        first = dict(zip(first_ids, first_scores))
        z_logit = (logits - logits.mean()) / logits.std()
        bm25 = np.array([first[t] for t in ids])
        expected = dict(zip(ids, 0.5 * z_logit + 0.5 * (bm25 - bm25.mean()) / bm25.std()))
        np.testing.assert_allclose(fused_scores, [expected[t] for t in fused_ids], atol=1e-4)
        assert list(fused_scores) == sorted(fused_scores, reverse=True)
    # a saved reranker folder references the model directory and gives the same answer
    reranker.save(tmp_path / "rr")
    saved = json.loads((tmp_path / "rr" / "config.json").read_text())
    assert saved["kind"] == RERANKER_KIND and saved["reranker"] == "cross"
    assert saved["model"] == str(trained["out"].resolve()) and saved["depth"] == 10
    again = load_reranker(tmp_path / "rr", batch_size=2)  # options override the saved settings
    assert again.batch_size == 2
    for (a_ids, a), (b_ids, b) in zip(got, again.rerank(QUERIES, candidates, sample_tools)):
        assert list(a_ids) == list(b_ids)
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_rerank_keeps_exactly_the_candidates_sorted_by_probability(trained, sample_tools):
    reranker = load_reranker(trained["out"], depth=20, first_stage_weight=0.0)
    first = _candidates(sample_tools, QUERIES, k=20)
    candidates = Results(first.ids + (np.asarray([], dtype=object),), first.scores + (np.asarray([], np.float32),))
    got = reranker.rerank(QUERIES + ["no candidates"], candidates, sample_tools)
    assert len(got) == 4 and len(got.ids[3]) == 0
    for (ids, scores), (cand, _s) in zip(got, candidates):
        assert len(ids) == len(cand) and set(ids) == set(cand)
        assert np.all(np.diff(scores) <= 0)  # best first
        assert np.all((scores >= 0) & (scores <= 1))  # P(relevant)
    with pytest.raises(ValueError):
        reranker.rerank(QUERIES[:1], first, sample_tools)
    with pytest.raises(KeyError, match="not among the tools"):
        reranker.rerank(QUERIES[:1], Results.from_lists([["ghost"]], [[1.0]]), sample_tools)


def test_edited_tool_gets_a_fresh_text(trained, sample_tools):
    reranker = load_reranker(trained["out"])
    tool = next(iter(sample_tools.values()))
    before = reranker.tool_text(tool)
    assert reranker.tool_text(tool.with_changes()) == before
    assert reranker.tool_text(tool.with_changes(description="Completely new text.")) != before


def test_wrong_or_missing_model_dir_is_a_clear_error(tmp_path, trained):
    embed_dir = tmp_path / "embed"
    with write_artifact(embed_dir, model_base("embed", encoder="encoder")):
        pass
    with pytest.raises(ArtifactError, match="'embed' model, not a 'cross' model"):
        CrossEncoderReranker(model=str(embed_dir))
    with pytest.raises(ArtifactError, match="first stage, not a reranker"):
        load_reranker(embed_dir)
    with pytest.raises(ArtifactError, match="no such cross-encoder model directory"):
        CrossEncoderReranker(model=str(tmp_path / "missing"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="not a toolscout model directory"):
        CrossEncoderReranker(model=str(tmp_path / "plain"))
    broken = tmp_path / "broken"
    with write_artifact(broken, model_base("cross", model="model")):
        pass
    with pytest.raises(ArtifactError, match="weights are missing"):
        CrossEncoderReranker(model=str(broken))


def test_cli_trains_a_cross_encoder(tmp_path, tiny_model):
    out = tmp_path / "cli-cross"
    code = main(["train", "cross", "--data", str(SAMPLE), "--out", str(out), "--model", tiny_model,
                 "--max-steps", "3", "--batch-size", "4",
                 "--validation-fraction", "0.2", "--quiet", "-o", "max_length=64", "-o", "max_validation=4",
                 "-o", "rerank_depth=5"])
    assert code == 0
    summary = json.loads((out / (out / "CURRENT").read_text().strip() / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["config"]["first_stage"] == "dense"
    assert isinstance(load_reranker(out), CrossEncoderReranker)


def test_cli_rerank_options_reach_the_reranker(trained, tmp_path, capsys):
    # first_stage_weight=1 mixes in nothing of the cross-encoder: the reranked run must equal the first stage
    report = tmp_path / "eval.json"
    code = main(["eval", str(SAMPLE), "--split", "train", "--retriever", "bm25", "--rerank", str(trained["out"]),
                 "--rerank-option", "first_stage_weight=1", "--with-first-stage", "--json", str(report), "--quiet",
                 "--bootstrap", "100"])
    assert code == 0, capsys.readouterr().err
    systems = json.loads(report.read_text())["systems"]
    first, second = systems["bm25"]["mean"], systems[next(s for s in systems if s != "bm25")]["mean"]
    for metric in ("ndcg@10", "recall@10", "mrr@10"):
        assert second[metric] == pytest.approx(first[metric], abs=1e-9)
    capsys.readouterr()
    assert main(["eval", str(SAMPLE), "--rerank", str(trained["out"]), "--rerank-option", "temperature=2",
                 "--quiet"]) == 1
    assert "temperature is not a setting of the cross reranker (its settings: depth" in capsys.readouterr().err
    assert main(["eval", str(SAMPLE), "--rerank-option", "first_stage_weight=0", "--quiet"]) == 1
    assert "need --rerank" in capsys.readouterr().err

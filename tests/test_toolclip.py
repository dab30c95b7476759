"""ToolCLIP: the two towers, the training loss and schedule, the model directory and the retriever.

Kept fast: tiny sequence lengths, the 12-tool catalog from conftest, a handful of optimiser steps, and
one trained model shared by the tests that need one.
"""

import json
import math

import numpy as np
import pytest
import torch

from toolscout import ToolScout
from toolscout.artifacts import ArtifactError
from toolscout.benchmark_sets import BenchmarkSet, Query
from toolscout.models import model_config
from toolscout.results import Filter
from toolscout.retrievers.toolclip import ToolCLIPRetriever
from toolscout.retrievers.toolclip_model import ToolCLIPConfig, load_model, new_model, tool_parts
from toolscout.tool import Tool, tool_text
from toolscout.train import TrainConfig, load_training_data
from toolscout.train.data import TrainingData
from toolscout.train.losses import hard_negative_loss, info_nce
from toolscout.train.toolclip import (
    Batch,
    ToolCLIPObjective,
    ToolCLIPOptions,
    fit_toolclip,
    pair_hard_nce,
    pair_nce,
    row_batches,
    training_rows,
)

pytestmark = pytest.mark.slow  # trains

TINY = dict(max_query_length=16, max_name_length=8, max_description_length=16, max_param_length=8, max_params=2)

QUERIES = [
    ("what will the weather be in Oslo this weekend", ["weather.get_forecast"]),
    ("is it raining in Berlin right now", ["weather.get_current"]),
    ("find flights from JFK to LHR on Friday", ["flights.search"]),
    ("find a flight to Rome and book it for Ana", ["flights.search", "flights.book"]),
    ("reserve a hotel room in Paris for three nights", ["hotels.book"]),
    ("fly to Madrid and get a hotel there", ["flights.search", "hotels.book"]),
    ("send an email to the team about the launch", ["mail.send"]),
    ("look for the invoice email from last week", ["mail.search"]),
    ("put a meeting with Sam on my calendar tomorrow at 10", ["calendar.create"]),
    ("what is on my agenda next week", ["calendar.list"]),
    ("how many euros is 250 dollars", ["math.convert_currency"]),
    ("current share price of ACME", ["stocks.quote"]),
    ("open notes.txt and show me what it says", ["files.read"]),
    ("check next week's events and email them to Bob", ["calendar.list", "mail.send"]),
    ("convert 100 GBP to USD and buy ACME stock price check", ["math.convert_currency", "stocks.quote"]),
    ("forecast for Lisbon and flights there", ["weather.get_forecast", "flights.search"]),
]


def _bench(tools):
    queries = [Query(f"q{i}", text, tuple(labels), "train") for i, (text, labels) in enumerate(QUERIES)]
    queries.append(Query("t0", "weather in Oslo tomorrow", ("weather.get_forecast",), "test"))
    return BenchmarkSet("mini", list(tools), queries)


def _write_bench(folder, tools):
    folder.mkdir(parents=True)
    with open(folder / "tools.jsonl", "w") as fh:
        for t in tools:
            fh.write(json.dumps({"id": t.id, "name": t.name, "description": t.description,
                                 "parameters": t.parameters}) + "\n")
    with open(folder / "queries.jsonl", "w") as fh:
        for q in _bench(tools).queries:
            fh.write(json.dumps({"id": q.id, "query": q.text, "labels": list(q.labels), "split": q.split}) + "\n")


def _train_config(**kw):
    return TrainConfig(**{"batch_size": 8, "lr": 1e-4, "warmup_ratio": 0.0, "progress": False, **kw})


@pytest.fixture(scope="module")
def runs():
    return {}


@pytest.fixture(scope="module")
def fresh():
    """An untrained ToolCLIP (model, featurizer) with tiny lengths, shared by the tests that only read it."""
    return new_model(ToolCLIPConfig(**TINY))


@pytest.fixture
def trained(runs, tools, tmp_path_factory):
    """One small training run for the module: (model dir, tools, data, summary, loss before, loss after)."""
    if "run" not in runs:
        runs["run"] = _train_once(tools, tmp_path_factory.mktemp("toolclip") / "model")
    return runs["run"]


def _train_once(tools, out):
    data = load_training_data([_bench(tools)], validation_fraction=0.0)
    options = dict(TINY, miner="bm25", stage1_fraction=0.5, hard_k=3, validate=False, train_layers=2)

    def full_loss(model, featurizer):
        objective = ToolCLIPObjective(model, featurizer, data, ToolCLIPOptions.make(**options), "cpu", 0)
        model.eval()
        with torch.no_grad():
            return objective(Batch(training_rows(data, True), 0, 1)).item()

    before = full_loss(*new_model(ToolCLIPOptions.make(**options).architecture("default")))
    summary = fit_toolclip(data, out, config=_train_config(epochs=6), **options)
    model, featurizer, _meta = load_model(out)
    return out, tools, data, summary, before, full_loss(model, featurizer)


# ------------------------------------------------------------------------------------ towers


def test_forward_shapes_unit_norms_gates_and_missing_components(tools, fresh):
    model, featurizer = fresh
    model.eval()
    bare = Tool("bare", "ping")  # no description, no parameters
    catalog = tools + [bare]
    with torch.no_grad():
        vectors, gates, present = model.encode_tools(featurizer.tools([featurizer.parts(t) for t in catalog]),
                                                     return_gates=True)
        tasks = model.encode_tasks(featurizer.tasks(["book a flight", "weather in Oslo tomorrow please"]))
    assert vectors.shape == (13, 384) and tasks.shape == (2, 384) and gates.shape == (13, 3, 384)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(13), atol=1e-5)
    assert torch.allclose(tasks.norm(dim=1), torch.ones(2), atol=1e-5)
    assert bool(((gates > 0) & (gates < 1)).all())
    # initial gates are σ(bias): name 0.5, description σ(1), parameters σ(-1)
    assert gates[0, :, 0].tolist() == pytest.approx([0.5, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))], rel=1e-5)
    assert present[-1].tolist() == [True, False, False] and present[0].tolist() == [True, True, True]
    # padding and batch neighbours change nothing: a tool alone encodes like in the batch
    with torch.no_grad():
        alone = model.encode_tools(featurizer.tools([featurizer.parts(tools[2])]))
        bare_alone = model.encode_tools(featurizer.tools([featurizer.parts(bare)]))
    assert torch.allclose(alone[0], vectors[2], atol=1e-5)
    assert torch.allclose(bare_alone[0], vectors[-1], atol=1e-5)


def test_tool_parts_split_name_description_and_parameters(tools):
    parts = tool_parts(tools[1], max_params=8)
    assert parts.name == "get Current Weather"
    assert parts.description == "Current temperature, wind and rain at a location."
    assert parts.parameters == ("location: City or coordinates",)
    assert tool_parts(tools[2], max_params=2).parameters == ("origin: Departure airport code",
                                                            "destination: Arrival airport code")
    # "document": the description component reads the whole text view, as the dense retriever embeds it
    document = tool_parts(tools[1], max_params=8, description_text="document")
    assert document.description == tool_text(tools[1]) == ("get Current Weather\n"
                                                           "Current temperature, wind and rain at a location.\n"
                                                           "Parameters: location: City or coordinates")
    assert (document.name, document.parameters) == (parts.name, parts.parameters)


def test_a_model_reading_descriptions_as_written_keeps_reading_them_so(tools):
    """A ToolCLIP model saved before descriptions were read as plain text (its view read as written) splits
    and hashes its tools from the descriptions as written, as it was trained."""
    from toolscout.retrievers.toolclip_model import hash_view
    from toolscout.tool import TextView

    tool = Tool("t", "get_x", "See [the docs](https://x.io/a). Returns <b>x</b> &amp; y.")
    saved = TextView.from_dict({k: v for k, v in TextView().to_dict().items() if k != "descriptions"})
    assert tool_parts(tool, saved).description == "See [the docs](https://x.io/a). Returns <b>x</b> &amp; y."
    assert tool_parts(tool, TextView()).description == "See the docs. Returns x & y."
    assert hash_view(ToolCLIPConfig(view=saved.to_dict())).descriptions == "as-written"
    assert hash_view(ToolCLIPConfig()).descriptions == "plain"


def test_document_option_reaches_the_saved_architecture(tools, tmp_path):
    options = ToolCLIPOptions.make(description_text="document", gate_bias=[-2, 3, -2], **TINY)
    config = options.architecture("default")
    assert (config.description_text, config.gate_bias) == ("document", (-2.0, 3.0, -2.0))
    assert ToolCLIPConfig.from_dict(config.to_dict()) == config
    assert ToolCLIPConfig.from_dict({k: v for k, v in config.to_dict().items() if k != "description_text"}
                                    ).description_text == "description"  # models saved before the option
    default = ToolCLIPOptions.make().architecture("default")  # the defaults chosen on validation
    assert (default.description_text, default.gate_bias) == ("document", (-2.0, 3.0, -2.0))
    paper = ToolCLIPOptions.make(description_text="description", gate_bias=None).architecture("default")
    assert (paper.description_text, paper.gate_bias) == ("description", ToolCLIPConfig().gate_bias)
    with pytest.raises(ValueError, match="description_text='all'"):
        ToolCLIPOptions.make(description_text="all")
    with pytest.raises(ValueError, match="gate_bias=.*three numbers"):
        ToolCLIPOptions.make(gate_bias=[1, 2])
    model, featurizer = new_model(config)
    gates = torch.sigmoid(model.gates.bias * model.gates.mult)[:, 0]
    assert torch.allclose(gates, torch.sigmoid(torch.tensor([-2.0, 3.0, -2.0])))
    assert featurizer.parts(tools[1]).description.startswith("get Current Weather\n")


def test_attention_pool_starts_as_masked_mean_and_follows_its_query():
    from toolscout.retrievers.toolclip_nn import AttentionPool

    pool = AttentionPool(4, 1, mult=1.0)
    states = torch.tensor([[[1.0, 0, 0, 0], [0, 1.0, 0, 0], [9.0, 9, 9, 9]]])
    mask = torch.tensor([[True, True, False]])
    assert pool(states, mask).tolist() == [[0.5, 0.5, 0.0, 0.0]]  # the padded row is ignored
    with torch.no_grad():
        pool.query.copy_(torch.tensor([[2.0, 0, 0, 0]]))  # logits 2/√4 = 1 and 0 → weights e/(e+1), 1/(e+1)
    w = math.e / (math.e + 1)
    assert pool(states, mask)[0].tolist() == pytest.approx([w, 1 - w, 0.0, 0.0], rel=1e-5)
    assert pool(states, torch.zeros(1, 3, dtype=torch.bool)).tolist() == [[0.0] * 4]  # nothing valid: zeros


def test_shared_towers_really_share_weights(fresh):
    separate = fresh[0]
    shared, _ = new_model(ToolCLIPConfig(shared_towers=True, **TINY))
    assert shared.tool_tower is shared.task_transformer and shared.tool_head is shared.task_projection
    assert separate.tool_tower is not separate.task_transformer
    transformer = sum(p.numel() for p in shared.task_transformer.parameters())
    projection = sum(p.numel() for p in shared.task_projection.parameters())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(separate) - count(shared) == transformer + projection
    assert len({id(p) for p in shared.parameters()}) == len(list(shared.parameters()))


def test_train_layers_freezes_the_lower_layers():
    model, _ = new_model(ToolCLIPConfig(train_layers=2, **TINY))
    for tower in (model.task_transformer, model.tool_tower):
        flags = [all(p.requires_grad for p in layer.parameters()) for layer in tower.encoder.layer]
        assert flags == [False] * 4 + [True] * 2
        assert not any(p.requires_grad for p in tower.embeddings.parameters())
    assert model.intent_pool.query.requires_grad and model.gates.weight.requires_grad


# -------------------------------------------------------------------------------------- loss


def test_pair_losses_match_the_reference_losses():
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(3, 8), dim=1)
    t = torch.nn.functional.normalize(torch.randn(6, 8), dim=1)
    positives = torch.tensor([[True, False, True, False, False, False],
                              [False, True, False, False, False, False],
                              [False, False, False, True, True, False]])
    first = positives.float().argmax(dim=1)
    logits = q @ t.T / 0.1
    assert pair_nce(logits, positives, first).item() == pytest.approx(
        info_nce(q, t, positives, tau=0.1, multi_positive=False).item(), rel=1e-6)
    only_one = torch.tensor([[True, False, False, False, False, False]])  # one gold tool: both forms agree
    assert pair_hard_nce(logits[:1], only_one, first[:1], 2).item() == pytest.approx(
        hard_negative_loss(q[:1], t, only_one, top_k=2, tau=0.1).item(), rel=1e-6)
    # a row's other gold tool is never its negative: moving it changes nothing for that row
    moved = t.clone()
    moved[2] = q[0]
    assert pair_nce(q[:1] @ moved.T / 0.1, positives[:1], first[:1]).item() == pytest.approx(
        pair_nce(logits[:1], positives[:1], first[:1]).item(), rel=1e-6)
    assert pair_hard_nce(logits, positives, first, 6).item() == pytest.approx(
        pair_nce(logits, positives, first).item(), rel=1e-6)  # K ≥ all negatives: the full loss


def test_rows_stages_and_extra_negatives(tools, fresh):
    data = load_training_data([_bench(tools)], validation_fraction=0.0)
    assert len(training_rows(data, True)) == 16
    assert len(training_rows(data, False)) == 16 + 5  # five two-tool queries give two pairs each
    model, featurizer = fresh
    rows = training_rows(data, True)[:4]
    for mode in ("random", "hard"):
        miner = None
        if mode == "hard":
            from toolscout.retrievers.bm25 import BM25Retriever

            miner = BM25Retriever()
            miner.index(tools)
        objective = ToolCLIPObjective(model, featurizer, data,
                                      ToolCLIPOptions.make(negatives=mode, extra_per_query=2, miner="bm25", **TINY),
                                      "cpu", 0, miner)
        assert objective.extra_negatives(Batch(rows, 0, 1)) == []  # stage 1: in-batch only
        extra = objective.extra_negatives(Batch(rows, 3, 2))
        if mode == "random":
            assert len(extra) == 8 and len(set(extra)) >= 2
            per_query = [extra[i:i + 2] for i in range(0, 8, 2)]
        else:  # the first stage's best non-gold tools (BM25 returns only tools sharing a word)
            per_query = [[t for t in miner.search([q.text], 30).ids[0] if t not in q.labels][:2] for q, _ in rows]
            assert extra == [t for pair in per_query for t in pair] and extra
        for (query, _), pair in zip(rows, per_query):
            assert not set(pair) & set(query.labels)  # gold tools are never negatives
        assert objective.extra_negatives(Batch(rows, 3, 2)) == extra  # deterministic (resume-safe)


def _two_sets(tools):
    """Set 'a' (the fixture's tools, 16 tasks) and a small set 'b' (two tools, 2 tasks) with the same words."""
    a_tools = {f"a::{t.id}": t.with_changes(id=f"a::{t.id}") for t in tools}
    b_tools = {f"b::{n}": Tool(id=f"b::{n}", name=n, description=d) for n, d in
               [("forecast", "weather forecast for a city this weekend"), ("flights", "find flights between cities, e.g. from Oslo")]}
    a_queries = [Query(f"a{i}", text, tuple(f"a::{x}" for x in labels), "train") for i, (text, labels) in enumerate(QUERIES)]
    b_queries = [Query("b0", "weather in Oslo this weekend", ("b::forecast",), "train"),
                 Query("b1", "flights from Oslo to Rome", ("b::flights",), "train")]
    return TrainingData({**a_tools, **b_tools}, a_queries + b_queries, [], ["a", "b"])


def test_several_sets_get_equal_shares_and_mine_negatives_within_their_own_set(tools, fresh):
    data = _two_sets(tools)
    rows = training_rows(data, True)
    groups = [q.id[0] for q, _ in rows]
    balanced = [r for batch in row_batches(rows, groups, "sets", 4, seed=0, epoch=0) for r in batch]
    assert len(balanced) == len(rows)  # an epoch keeps its size, split evenly: 9 tasks of each set
    assert sum(q.id.startswith("b") for q, _ in balanced) == 9
    by_size = [r for batch in row_batches(rows, groups, "size", 4, seed=0, epoch=0) for r in batch]
    assert sorted(q.id for q, _ in by_size) == sorted(q.id for q, _ in rows)  # every task once

    from toolscout.retrievers.bm25 import BM25Retriever

    miner = BM25Retriever()
    miner.index(list(data.tools.values()))
    filters = {name: Filter.make(ids=[t for t in data.tools if t.startswith(name + "::")]) for name in ("a", "b")}
    model, featurizer = fresh
    options = ToolCLIPOptions.make(extra_per_query=3, miner="bm25", **TINY)
    own_set = ToolCLIPObjective(model, featurizer, data, options, "cpu", 0, miner, filters)
    pooled = ToolCLIPObjective(model, featurizer, data, options, "cpu", 0, miner)
    b_row = [r for r in rows if r[0].id == "b0"]
    assert any(t.startswith("a::") for t in pooled.extra_negatives(Batch(b_row, 9, 2)))  # pooled: other set's tools
    assert own_set.extra_negatives(Batch(b_row, 9, 2)) == ["b::flights"]  # within set b: its one non-gold tool
    a_rows = [r for r in rows if r[0].id.startswith("a")][:4]
    assert all(t.startswith("a::") for t in own_set.extra_negatives(Batch(a_rows, 9, 2)))


def test_unknown_options_are_named():
    with pytest.raises(ValueError, match="unknown toolclip option.*'lamda'.*known:"):
        ToolCLIPOptions.make(lamda=1.0)
    with pytest.raises(ValueError, match="negatives='semi'"):
        ToolCLIPOptions.make(negatives="semi")
    with pytest.raises(ValueError, match="balance='even'"):
        ToolCLIPOptions.make(balance="even")


# ---------------------------------------------------------------------------------- training


def test_training_lowers_the_loss_and_writes_a_model_dir(trained):
    out, _tools, _data, summary, before, after = trained
    assert after < 0.8 * before
    assert summary.steps == 12 and summary.examples == 6 * 16
    folder, config = model_config(out, method="toolclip")
    assert config["architecture"]["max_query_length"] == 16 and config["summary"]["steps"] == 12
    assert config["training"]["negatives"] == "hard" and config["summary"]["config"]["stage2_from_step"] == 6
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer" / "tokenizer.json").exists()
    assert not out.with_name(out.name + ".checkpoint").exists()


def test_reload_gives_identical_scores_and_new_tools_need_no_retraining(trained, tmp_path):
    out, tools, _data, _summary, _before, _after = trained
    queries = ["weather in Oslo tomorrow", "book a flight", "email my boss"]
    a = ToolCLIPRetriever(model=out)
    a.index(tools)
    scout = ToolScout.from_tools(tools, retriever="toolclip", model=str(out))  # a second load of the model dir
    for (ia, sa), (ib, sb) in zip(a.search(queries, k=5), scout.retrieve(queries, k=5)):
        assert list(ia) == list(ib) and np.array_equal(sa, sb)
    scout.save(tmp_path / "idx")
    loaded = ToolScout.load(tmp_path / "idx")
    for hits, other in zip(scout.search(queries, k=5), loaded.search(queries, k=5)):
        assert [(h.tool.id, h.score) for h in hits] == [(h.tool.id, h.score) for h in other]

    song = Tool("music.play", "play_song", "Play a song or an album from the music library on the speakers.",
                {"type": "object", "properties": {"title": {"type": "string", "description": "Song title"}}})
    loaded.add([song])
    assert loaded.retriever.encoded_last == 1
    assert loaded.search("play a song by the Beatles", k=1)[0].tool.id == "music.play"
    hits = loaded.search("play a song by the Beatles", k=3, namespaces=["mail"])
    assert hits and all(h.tool.namespace == "mail" for h in hits)  # filters go through the store

    config_file = next((tmp_path / "idx").glob("v*/retriever/config.json"))
    config = json.loads(config_file.read_text())
    config["weights_sha"] = "0" * 24  # as if the model had been retrained since
    config_file.write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match="rebuild the index"):
        ToolScout.load(tmp_path / "idx")


def test_unseen_catalog_works_zero_shot(trained):
    out = trained[0]
    unseen = [Tool("pets.adopt", "adopt_pet", "Adopt a cat or a dog from the animal shelter."),
              Tool("cook.recipe", "find_recipe", "Find a cooking recipe for a dish and its ingredients."),
              Tool("car.rent", "rent_car", "Rent a car at an airport for some days.")]
    retriever = ToolCLIPRetriever(model=out)
    retriever.index(unseen)
    assert retriever.search(["I want to adopt a kitten"], k=1).ids[0][0] == "pets.adopt"
    assert retriever.search(["how do I make lasagna"], k=1).ids[0][0] == "cook.recipe"


def test_cli_train_writes_a_loadable_model_dir(tools, tmp_path, capsys):
    from toolscout.cli import main

    _write_bench(tmp_path / "mini", tools)
    args = ["train", "toolclip", "--data", str(tmp_path / "mini"), "--out", str(tmp_path / "m"), "--max-steps", "2",
            "--batch-size", "8", "--quiet", "--validation-fraction", "0.2", "-o", "shared_towers=true",
            "-o", "multi_positive=false", "-o", "negatives=random", "-o", "stage1_fraction=0.5"]
    args += [x for k, v in TINY.items() for x in ("-o", f"{k}={v}")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "trained toolclip" in err and "best validation nDCG@10" in err
    _folder, config = model_config(tmp_path / "m", method="toolclip")
    assert config["architecture"]["shared_towers"] is True and config["training"]["multi_positive"] is False
    assert config["summary"]["steps"] == 2 and config["summary"]["best_validation"] is not None
    retriever = ToolCLIPRetriever(model=tmp_path / "m")
    retriever.index(tools)
    assert len(retriever.search(["book a flight"], k=3).ids[0]) == 3

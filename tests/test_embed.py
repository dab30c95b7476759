"""Tool-Embed (`toolscout train embed`): sampler, batching, a tiny real fine-tuning run, saved model dirs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from toolscout.benchmark_sets import Query
from toolscout.cli import main
from toolscout.encoders import Encoder
from toolscout.train.data import TrainingData, load_training_data
from toolscout.train.embed import BatchLoss, RandomNegatives, epoch_examples, make_batches, tool_sets, training_pairs
from toolscout.train.loop import TrainConfig

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
TINY = {"max_query_length": 24, "max_doc_length": 24, "validate_start": False, "negatives": 2}


# slow: trains; trained models encode with torch (conftest)
pytestmark = [pytest.mark.usefixtures("torch_encoders"), pytest.mark.slow]


@pytest.fixture(scope="module")
def sample_data() -> TrainingData:
    return load_training_data([SAMPLE], validation_fraction=0.2)


def test_random_negatives_never_include_a_gold_tool():
    ids = [f"t{i}" for i in range(20)]
    sampler = RandomNegatives(ids)
    rng = random.Random(0)
    gold = {"t0", "t3", "t7"}
    draws = [sampler.sample(gold, 5, rng) for _ in range(500)]
    assert all(len(d) == 5 and len(set(d)) == 5 and not set(d) & gold for d in draws)
    assert set().union(*draws) == set(ids) - gold  # every other tool does get drawn
    # a catalog with fewer non-gold tools than asked for: all of them, still no gold
    assert sorted(RandomNegatives(["a", "b", "c"]).sample({"a"}, 5, rng)) == ["b", "c"]
    assert RandomNegatives(["a"]).sample({"a"}, 3, rng) == []
    # the same seed gives the same draws (resumed runs redo exactly the same batches)
    assert sampler.sample(gold, 5, random.Random(3)) == sampler.sample(gold, 5, random.Random(3))


def test_batches_pair_each_gold_tool_and_never_use_a_gold_tool_as_negative():
    queries = [Query("q0", "a", ("x", "y")), Query("q1", "b", ("z",)), Query("q2", "c", ("x", "ghost"))]
    tools = ["x", "y", "z", "n1", "n2", "n3"]
    pairs = training_pairs(queries, frozenset(tools))
    assert pairs == [(0, "x"), (0, "y"), (1, "z"), (2, "x")]  # labels outside the catalog are skipped
    examples = epoch_examples(pairs, ["s"] * len(pairs), "size", seed=0, epoch=0)
    assert sorted(examples) == sorted(pairs)
    batches = make_batches(examples, queries, RandomNegatives(tools), negatives=3, batch_size=3, seed=0, epoch=0)
    assert [len(b) for b in batches] == [3, 1]
    for ex in (ex for b in batches for ex in b):
        assert len(ex.negatives) == 3 and not set(ex.negatives) & set(queries[ex.query].labels)
    again = make_batches(examples, queries, RandomNegatives(tools), negatives=3, batch_size=3, seed=0, epoch=0)
    assert again == batches


def test_set_balance_gives_each_set_the_same_share():
    pairs = [(i, f"big{i % 7}") for i in range(90)] + [(90 + i, f"small{i}") for i in range(10)]
    groups = ["big"] * 90 + ["small"] * 10
    examples = epoch_examples(pairs, groups, "sets", seed=1, epoch=0)
    assert len(examples) == 100
    small = [e for e in examples if e[1].startswith("small")]
    assert len(small) == 50 and all(small.count(p) == 5 for p in pairs[90:])
    big = [e for e in examples if e[1].startswith("big")]
    assert len(big) == 50 and len(set(big)) == 50  # a subset of the big set, no repeats
    assert epoch_examples(pairs, groups, "sets", seed=1, epoch=1) != examples  # a fresh subset each epoch


def test_tool_sets_from_set_prefixes():
    data = TrainingData({"apibank::A": None, "apibank_x::B": None, "other": None}, [], [], ["apibank", "apibank_x"])
    assert tool_sets(data) == {"apibank::A": "apibank", "apibank_x::B": "apibank_x", "other": ""}


def test_multi_positive_loss_does_not_push_away_other_gold_tools():
    """The InfoNCE of a batch equals the formula computed by hand from the embeddings."""
    model = Encoder.load(None, backend="torch").model
    model.eval()
    queries = [Query("q0", "book a flight and a hotel", ("f", "h")), Query("q1", "weather in Paris", ("w",))]
    docs = {"f": "book flight", "h": "reserve hotel room", "w": "weather forecast", "n": "send an email"}
    loss = BatchLoss(model, queries, docs, loss="infonce", tau=0.1, margin=0.3, max_query_length=32,
                     max_doc_length=32, device="cpu")
    from toolscout.train.embed import Example

    batch = [Example(0, "f", ("n",)), Example(0, "h", ("w",)), Example(1, "w", ("n",))]
    with torch.no_grad():
        got = loss(batch).item()
    def embed(texts):
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)

    q = embed([queries[0].text, queries[1].text])
    t = embed([docs["f"], docs["h"], docs["w"], docs["n"]])  # columns: pairs' tools first, then negatives
    s = q @ t.T / 0.1
    row0 = -np.log(np.exp(s[0, :2]).sum() / np.exp(s[0]).sum())  # f and h both positive for q0
    row1 = -np.log(np.exp(s[1, 2]) / np.exp(s[1]).sum())
    assert got == pytest.approx((row0 + row1) / 2, rel=1e-3)


@pytest.fixture(scope="module")
def trained(sample_data, tmp_path_factory):
    """A tiny real run through the CLI: 5 steps of 4 pairs on the bundled API-Bank sample."""
    out = tmp_path_factory.mktemp("embed") / "model"
    model = Encoder.load("minilm", backend="torch").model  # the untrained base the run starts from
    docs = {tid: tool_text_of(t) for tid, t in sample_data.tools.items()}
    probe = make_batches(training_pairs(sample_data.train, frozenset(docs))[:8], sample_data.train,
                         RandomNegatives(list(docs)), 2, 8, seed=5, epoch=0)[0]

    def probe_loss(st_model) -> float:
        st_model.eval()
        fn = BatchLoss(st_model, sample_data.train, docs, loss="infonce", tau=0.05, margin=0.3, max_query_length=24,
                       max_doc_length=24, device="cpu")
        with torch.no_grad():
            return fn(probe).item()

    before = probe_loss(model)
    code = main(["train", "embed", "--data", str(SAMPLE), "--out", str(out), "--model", "minilm",
                 "--validation-fraction", "0.2", "--max-steps", "5", "--batch-size", "4", "--lr", "2e-4", "--quiet",
                 *[f"-o{k}={json.dumps(v)}" for k, v in TINY.items()]])
    assert code == 0
    from sentence_transformers import SentenceTransformer

    reloaded = SentenceTransformer(str(_encoder_folder(out)), device="cpu")  # a plain sentence-transformers folder
    summary = json.loads((_encoder_folder(out).parent / "summary.json").read_text())
    return {"out": out, "summary": summary, "before": before, "after": probe_loss(reloaded), "model": reloaded}


def tool_text_of(tool):
    from toolscout.tool import tool_text

    return tool_text(tool)


def _encoder_folder(out: Path) -> Path:
    from toolscout.models import model_config

    folder, config = model_config(out, method="embed")
    return folder / config["encoder"]


def test_training_lowers_the_loss_and_writes_a_model_dir(trained):
    summary = trained["summary"]
    assert summary["steps"] == 5 and summary["examples"] == 5 * 4 and summary["examples_per_s"] > 0
    assert trained["after"] < trained["before"] * 0.8, (trained["before"], trained["after"])
    losses = [h["loss"] for h in summary["history"] if "loss" in h]
    assert losses and all(np.isfinite(losses))
    assert summary["best_validation"] is not None and summary["data"]["pairs"] > 0
    assert summary["config"]["negatives"] == 2 and summary["config"]["balance"] == "sets"
    out = trained["out"]
    assert not out.with_name(out.name + ".checkpoint").exists()  # the resumable state is gone once saved
    config = json.loads((_encoder_folder(out).parent / "config.json").read_text())
    assert config["kind"] == "toolscout.model" and config["method"] == "embed" and config["loss"] == "infonce"


def test_dense_retriever_loads_the_model_dir_and_survives_a_pipeline_save(trained, sample_data, tmp_path):
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.dense import DenseRetriever

    out = trained["out"]
    tools = list(sample_data.tools.values())
    retriever = DenseRetriever(model=str(out))
    # the fine-tuned weights, not the base model's
    text = sample_data.train[0].text
    want = trained["model"].encode([text], normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(retriever.encoder.encode([text]), want, atol=1e-5)
    base = Encoder.load(None).encode([text])
    assert float(np.sum(base * want)) < 0.9999

    scout = ToolScout.from_tools(tools, retriever="dense", model=str(out))
    queries = [q.text for q in sample_data.train[:5]]
    before = scout.retriever.search(queries, k=5)
    scout.save(tmp_path / "pipe")
    loaded = ToolScout.load(tmp_path / "pipe")
    after = loaded.retriever.search(queries, k=5)
    for (ids_a, s_a), (ids_b, s_b) in zip(before, after):
        assert list(ids_a) == list(ids_b)
        np.testing.assert_allclose(s_a, s_b, atol=1e-6)


def test_cli_eval_encodes_unseen_tools_with_the_trained_dir(trained, tmp_path, capsys):
    from toolscout import evaluate
    from toolscout.pipeline import DEFAULT_INTENT_MERGE, ToolScout

    alpha = Path(__file__).parent / "fixtures" / "eval" / "alpha"  # tools the model never saw in training
    report = tmp_path / "eval.json"
    code = main(["eval", str(alpha), "--retriever", "dense", "--model", str(trained["out"]), "--json", str(report),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    got = json.loads(report.read_text())["sets"]["alpha"]

    def figures(model, intents=DEFAULT_INTENT_MERGE):  # the same set through the Python API, the model given directly
        return evaluate([alpha], lambda tools: ToolScout.from_tools(tools, retriever="dense", model=model,
                                                                    intents=intents),
                        progress=False).to_json()["sets"]["alpha"]

    assert got["queries"] == 8 and got == pytest.approx(figures(str(trained["out"])), abs=1e-9)
    # only the trained encoder ranks like this: against the base it was trained from, one query at a time
    # (whole tasks only: splitting them into requests happens to even the two out on this small set)
    trained_whole, untrained_whole = figures(str(trained["out"]), None), figures("minilm", None)
    assert abs(trained_whole["ndcg@10"] - untrained_whole["ndcg@10"]) > 0.5


def test_tool2vec_finetune_saves_its_encoder(sample_data, tmp_path, tiny_model):
    from toolscout.retrievers.tool2vec import Tool2VecRetriever
    from toolscout.train.tool2vec import fit_tool2vec

    out = tmp_path / "t2v"
    config = TrainConfig(batch_size=4, lr=1e-4, progress=False)
    summary = fit_tool2vec(sample_data, out, model=tiny_model, config=config, finetune=True, finetune_steps=2,
                           priors=(1.0,), finetune_options=TINY)
    assert summary.data["finetune"]["steps"] == 2 and summary.config["finetune_loss"] == "infonce"
    assert not out.with_name("t2v.finetune").exists()
    retriever = Tool2VecRetriever(model=str(out))
    folder = Path(retriever.encoder.path)
    assert folder.name == "encoder" and (folder / "modules.json").exists()
    config_json = json.loads((folder.parent / "config.json").read_text())
    assert config_json["finetuned"] is True
    retriever.index(list(sample_data.tools.values()))
    ids, _ = retriever.search([sample_data.train[0].text], k=5)[0]
    assert len(ids) == 5


def test_cli_says_when_tool2vec_discards_its_fine_tune(tmp_path, tiny_model, capsys):
    """A learning rate of 1 wrecks the encoder in two steps: the fine-tune is discarded, and the result line says
    so, as `train embed`'s does, not only the summary."""
    out = tmp_path / "t2v"
    options = {**TINY, "validate_start": True, "max_validation": 8}
    code = main(["train", "tool2vec", "--data", str(SAMPLE), "--out", str(out), "--model", tiny_model,
                 "--validation-fraction", "0.2", "--batch-size", "4", "--lr", "1", "--quiet", "-o", "finetune=true",
                 "-o", "finetune_steps=2", "-o", f"finetune_options={json.dumps(options)}", "-o", "priors=[1.0]"])
    assert code == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    summary = json.loads((next(out.glob("v*")) / "summary.json").read_text())
    assert summary["data"]["finetune"]["discarded_for"]
    assert last.startswith("trained tool2vec") and "fine-tuning discarded" in last, last


# ------------------------------------------------------------------------------ what trains, hard negatives


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def base_state(tiny_model):
    return _state(Encoder.load(tiny_model, backend="torch").model)


@pytest.fixture(scope="module")
def tiny_fit(sample_data, tmp_path_factory, tiny_model):
    """fit_embed of the two-layer MiniLM (conftest) for 3 steps with the given options; the saved encoder's
    state dict and the run summary."""
    from sentence_transformers import SentenceTransformer

    from toolscout.train.embed import fit_embed

    runs = {}

    def run(**options):
        key = json.dumps(options, sort_keys=True)
        if key not in runs:
            out = tmp_path_factory.mktemp("fit") / "model"
            config = TrainConfig(batch_size=4, lr=2e-4, max_steps=3, progress=False, seed=3)
            summary = fit_embed(sample_data, out, model=tiny_model, config=config, max_validation=4,
                                **{**TINY, **options})
            model = SentenceTransformer(str(_encoder_folder(out)), device="cpu")
            runs[key] = (_state(model), summary)
        return runs[key]

    return run


@pytest.mark.parametrize("trainable, frozen, trained", [  # the two-layer model's layers are named 0 and 1
    ("all", [], ["embeddings.word_embeddings", "layer.0.", "layer.1."]),
    ("layers", ["embeddings.", "pooler."], ["layer.0.", "layer.1."]),
    ("top:1", ["embeddings.", "layer.0.", "pooler."], ["layer.1."]),
])
def test_trainable_leaves_frozen_tensors_bit_identical(tiny_fit, base_state, trainable, frozen, trained):
    state, summary = tiny_fit(trainable=trainable)
    assert state.keys() == base_state.keys()
    assert summary.config["trainable"] == trainable
    for name, tensor in state.items():
        if any(part in name for part in frozen):
            assert torch.equal(tensor, base_state[name]), f"{name} changed although {trainable!r} freezes it"
        elif any(part in name for part in trained) and not name.endswith("position_ids"):
            assert not torch.equal(tensor, base_state[name]), f"{name} did not train with {trainable!r}"
    # BERT tensors: 5 in the embedding block, 16 per layer, 2 in the pooler; here two layers
    n_trained = {"all": 5 + 2 * 16 + 2, "layers": 2 * 16, "top:1": 16}[trainable]
    assert summary.config["trainable_parameters"] == n_trained


def test_trainable_rejects_unknown_specs():
    from toolscout.train.embed import freeze_parameters

    model = Encoder.load(None, backend="torch").model
    for spec in ("top:0", "top:x", "embeddings", ""):
        with pytest.raises(ValueError, match="trainable"):
            freeze_parameters(model, spec)
    assert len(freeze_parameters(model, "top:99")) == 96  # more layers than the model has: all of them
    top_two = freeze_parameters(model, "top:2")  # of MiniLM-L6's six layers (16 tensors each): 4 and 5
    assert len(top_two) == 32 and all(".layer.4." in name or ".layer.5." in name for name in top_two)


def _two_set_catalog():
    from toolscout.tool import Tool

    tools = {t.id: t for t in [
        Tool("alpha::forecast", "get_forecast", "weather forecast for a city"),
        Tool("alpha::radar", "rain_radar", "rain radar map of the weather"),
        Tool("alpha::mail", "send_mail", "send an email message"),
        Tool("beta::forecast", "weather_forecast", "weather forecast for a city tomorrow"),
        Tool("beta::stocks", "stock_price", "price of a stock"),
    ]}
    queries = [Query("q0", "weather forecast for Paris tomorrow", ("alpha::forecast",), "train"),
               Query("q1", "stock price forecast for ACME", ("beta::stocks",), "train")]
    return tools, queries


def test_mined_negatives_are_top_non_gold_tools_of_the_query_set():
    from toolscout.retrievers.bm25 import BM25Retriever
    from toolscout.train.embed import MinedNegatives, set_filters

    tools, queries = _two_set_catalog()
    miner = BM25Retriever()
    miner.index(list(tools.values()))
    sets_of_tools = {tid: tid.split("::")[0] for tid in tools}
    mined = MinedNegatives(miner, queries, sets_of_tools, set_filters(sets_of_tools), per_query=1, depth=10)
    # q0: beta::forecast matches best lexically but is another catalog's tool; the gold tool never counts;
    # q1: alpha::forecast matches "forecast" as well as beta::forecast does, but only beta is q1's catalog
    assert mined([0, 1]) == {0: ("alpha::radar",), 1: ("beta::forecast",)}
    assert set(mined.mined) == {0, 1}


def test_batch_loss_adds_mined_negatives_as_columns():
    """A batch with mined negatives has the loss of the same batch with those tools as its negatives."""
    from toolscout.tool import tool_text
    from toolscout.train.embed import Example

    tools, queries = _two_set_catalog()
    docs = {tid: tool_text(t) for tid, t in tools.items()}
    model = Encoder.load(None, backend="torch").model
    model.eval()

    class Fixed:
        def __call__(self, indices):
            return {qi: {0: ("alpha::radar",), 1: ("beta::forecast",)}[qi] for qi in indices}

    def loss_of(batch, mined=None):
        fn = BatchLoss(model, queries, docs, loss="infonce", tau=0.05, margin=0.3, max_query_length=32,
                       max_doc_length=32, device="cpu", mined=mined)
        with torch.no_grad():
            return fn(batch).item()

    plain = [Example(0, "alpha::forecast", ("alpha::mail",)), Example(1, "beta::stocks", ())]
    spelled_out = [Example(0, "alpha::forecast", ("alpha::mail", "alpha::radar")),
                   Example(1, "beta::stocks", ("beta::forecast",))]
    assert loss_of(plain, Fixed()) == pytest.approx(loss_of(spelled_out), rel=1e-5)
    assert loss_of(plain, Fixed()) > loss_of(plain) + 1e-3  # the extra negatives do count


def test_fit_embed_uses_hard_negatives(tiny_fit):
    plain, _ = tiny_fit(trainable="layers")
    hard, summary = tiny_fit(trainable="layers", hard_negatives=2, miner="bm25")
    assert summary.config["hard_negatives"] == 2 and summary.config["miner"] == "bm25"
    changed = [k for k in plain if not torch.equal(plain[k], hard[k])]
    assert any("layer." in k for k in changed)  # same seed and batches: only the mined negatives differ


def test_a_discarded_run_ranks_exactly_as_its_starting_model(sample_data, tmp_path, tiny_model):
    """A learning rate of 1 wrecks the encoder in two steps, so validation keeps the starting model; the saved
    directory must then rank as that model does on its own (a pretrained encoder blends in each tool's summary),
    not as the bare weights with a trained directory's single view."""
    from toolscout.retrievers.dense import SUMMARY_WEIGHT, DenseRetriever
    from toolscout.train.embed import fit_embed

    out = tmp_path / "model"
    config = TrainConfig(batch_size=4, lr=1.0, max_steps=2, warmup_ratio=0, progress=False)
    summary = fit_embed(sample_data, out, model=tiny_model, config=config, max_validation=8,
                        **{**TINY, "validate_start": True})
    assert summary.discarded_for and summary.best_step == 0
    assert summary.best_validation == summary.data["start_validation"] > summary.data["last_validation_per_set"][""]
    tools, tasks = list(sample_data.tools.values())[:8], [q.text for q in sample_data.validation + sample_data.train[:8]]
    start, kept = DenseRetriever(model=tiny_model), DenseRetriever(model=str(out))
    start.index(tools)
    kept.index(tools)
    for (ids_a, s_a), (ids_b, s_b) in zip(start.search(tasks, k=len(tools)), kept.search(tasks, k=len(tools))):
        assert list(ids_a) == list(ids_b)
        np.testing.assert_allclose(s_a, s_b, atol=1e-6)
    assert kept.summary_weight == SUMMARY_WEIGHT  # recorded in the directory, as the start was validated


def test_length_chunks_give_the_embeddings_and_gradients_of_one_padded_batch():
    from toolscout.train.embed import embed_texts

    model = Encoder.load(None, backend="torch").model
    model.eval()  # no dropout: both passes compute the same function
    words = ["weather", "flight", "hotel", "email", "search", "book", "price"]
    rng = random.Random(1)
    texts = [" ".join(rng.choice(words) for _ in range(rng.choice([2, 5, 30, 90]))) for _ in range(11)]
    param = next(p for n, p in model.named_parameters() if "layer.5.output.dense.weight" in n)
    target = torch.randn(11, 384, generator=torch.Generator().manual_seed(0))
    results = {}
    for chunk in (0, 3):
        model.zero_grad()
        emb = embed_texts(model, texts, 64, "cpu", chunk=chunk)
        (emb * target).sum().backward()
        results[chunk] = (emb.detach().clone(), param.grad.detach().clone())
    np.testing.assert_allclose(results[3][0].numpy(), results[0][0].numpy(), atol=1e-5)
    np.testing.assert_allclose(results[3][1].numpy(), results[0][1].numpy(), atol=1e-4, rtol=1e-3)
    old_length, model.max_seq_length = model.max_seq_length, 64  # the 90-word texts are truncated, as above
    try:
        want = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)  # the library's encoding
    finally:
        model.max_seq_length = old_length
    np.testing.assert_allclose(results[3][0].numpy(), want, atol=1e-5)
    model.zero_grad()

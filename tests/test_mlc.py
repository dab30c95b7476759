"""MLC: training through the CLI, the saved model, unknown tools, filters, pipeline save/load."""

import json
import math
import warnings

import numpy as np
import pytest

from toolscout.artifacts import ArtifactError, resolve
from toolscout.benchmark_sets import BenchmarkSet, Query, write_benchmark
from toolscout.cli import main
from toolscout.encoders import Encoder
from toolscout.pipeline import ToolScout
from toolscout.results import Filter
from toolscout.retrievers.dense import DenseRetriever
from toolscout.retrievers.mlc import MLCRetriever
from toolscout.tool import Tool, tool_text
from toolscout.train.mlc import fit_platt

pytestmark = pytest.mark.slow  # trains

# Eight tools, each with its own vocabulary; queries are filled-in templates (a few need two tools).
TOOLS = {
    "weather": ("get_weather", "Weather forecast for a city: temperature, rain and wind.", "weather",
                ["will it rain in {c}", "weather forecast for {c}", "temperature in {c} tomorrow", "is it windy in {c}"]),
    "flight": ("search_flights", "Search flights between two airports.", "travel",
               ["find a flight to {c}", "cheap flights to {c}", "plane tickets to {c}", "flights from {c} on friday"]),
    "hotel": ("book_hotel", "Reserve a hotel room for some nights.", "travel",
              ["book a hotel in {c}", "hotel room in {c} for two nights", "reserve a room in {c}", "find me a hotel near {c}"]),
    "email": ("send_email", "Send an email to recipients.", "mail",
              ["email {p} about the meeting", "send a mail to {p}", "write an email to {p}", "message {p} by email"]),
    "calendar": ("create_event", "Create a calendar event.", "calendar",
                 ["schedule a meeting with {p}", "add an event with {p} to my calendar", "put lunch with {p} in my calendar",
                  "set up a call with {p}"]),
    "stocks": ("stock_quote", "Latest share price by ticker symbol.", "finance",
               ["share price of {t}", "how is {t} stock doing", "stock quote for {t}", "what does {t} trade at"]),
    "currency": ("convert_currency", "Convert money between currencies.", "finance",
                 ["convert 100 dollars to {m}", "exchange rate to {m}", "how much is 50 euros in {m}", "change money into {m}"]),
    "files": ("read_file", "Read a text file from disk.", "files",
              ["open the file {f}", "read {f} from disk", "show me what is in {f}", "print the contents of {f}"]),
}
FILL = {"c": ["Paris", "Rome", "Tokyo", "Lima"], "p": ["Alice", "Bob", "Chen", "Dana"], "t": ["AAPL", "IBM", "TSLA", "SAP"],
        "m": ["yen", "pounds", "francs", "pesos"], "f": ["notes.txt", "log.txt", "todo.md", "a.csv"]}
# tools the model never sees in training
NEW_TOOLS = [
    Tool("translate", "translate_text", "Translate text from one language into another language.", namespace="lang"),
    Tool("timer", "start_timer", "Start a countdown timer for a number of minutes.", namespace="clock"),
]


def _fill(template, i):
    return template.format(**{k: v[i % len(v)] for k, v in FILL.items()})


def _toy_set() -> BenchmarkSet:
    tools = [Tool(tid, name, desc, namespace=ns) for tid, (name, desc, ns, _t) in TOOLS.items()]
    queries, n = [], 0
    for tid, (_name, _desc, _ns, templates) in TOOLS.items():
        for i in range(12):
            queries.append(Query(f"q{n}", _fill(templates[i % 4], i), (tid,), "train" if i < 10 else "test"))
            n += 1
    for j, (a, b) in enumerate([("weather", "flight"), ("hotel", "flight"), ("email", "calendar"), ("stocks", "currency")] * 3):
        text = _fill(TOOLS[a][3][j % 4], j) + " and " + _fill(TOOLS[b][3][(j + 1) % 4], j)
        queries.append(Query(f"q{n}", text, (a, b), "train"))
        n += 1
    return BenchmarkSet("toy", tools, queries)


QUERIES = ["will it snow in Oslo", "send a mail to Erik", "share price of NVDA", "translate this text into French",
           "book a hotel in Madrid and find a flight"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small model, trained through the CLI: 12 head-only probe epochs, then 2 fine-tuning steps."""
    root = tmp_path_factory.mktemp("mlc")
    bset = _toy_set()
    write_benchmark(root / "toy", bset.tools, bset.queries)
    out = root / "model"
    code = main(["train", "mlc", "--data", str(root / "toy"), "--out", str(out), "--max-steps", "2",
                 "--batch-size", "16", "--lr", "5e-5", "--validation-fraction", "0.2", "--quiet",
                 "-o", "max_seq_length=16", "-o", "probe_epochs=12", "-o", "head_init=random", "-o", "head_lr=0.01",
                 "-o", "validate_at_start=false"])
    assert code == 0
    encoder = Encoder.load(str(resolve(out) / "encoder"), backend="torch")
    return {"root": root, "out": out, "set": bset, "encoder": encoder}


def _config(out):
    return json.loads((resolve(out) / "config.json").read_text())


def test_cli_training_writes_a_loadable_model_and_the_loss_falls(trained):
    config = _config(trained["out"])
    assert config["kind"] == "toolscout.model" and config["method"] == "mlc" and config["tools"] == 8
    assert json.loads((resolve(trained["out"]) / "tools.json").read_text()) == list(TOOLS)
    summary = config["summary"]
    probe_losses = [h["loss"] for h in summary["history"] if h.get("phase") == "probe" and "loss" in h]
    assert len(probe_losses) >= 3 and probe_losses[-1] < 0.7 * probe_losses[0]
    assert summary["steps"] == 2 and summary["best_validation"] is not None
    assert config["fallback_calibration"]["slope"] > 0
    assert not (trained["out"].parent / "model.checkpoint").exists()  # finish() removed the resumable state
    retriever = MLCRetriever(model=trained["out"], encoder=trained["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tool is in the head: nothing to warn of
        retriever.index(trained["set"].tools)
    assert retriever.search(["will it rain in Lima tomorrow"], 1).ids[0][0] == "weather"


def test_scores_are_the_sigmoid_of_the_head_logits(trained):
    head = np.load(resolve(trained["out"]) / "head.npz")
    retriever = MLCRetriever(model=trained["out"], encoder=trained["encoder"])
    retriever.index(trained["set"].tools)
    res = retriever.search(QUERIES, k=8)
    logits = trained["encoder"].encode(QUERIES) @ head["weight"].T + head["bias"]
    for q in range(len(QUERIES)):
        cols = [list(head["ids"]).index(t) for t in res.ids[q]]
        assert len(cols) == 8 and list(np.argsort(-logits[q], kind="stable")) == cols
        assert res.scores[q] == pytest.approx(1 / (1 + np.exp(-logits[q, cols])), abs=1e-6)


@pytest.mark.filterwarnings("ignore:the MLC head knows")  # said, and tested, above
def test_model_dir_and_saved_pipeline_give_identical_scores(trained, tmp_path):
    catalog = trained["set"].tools + NEW_TOOLS
    direct = MLCRetriever(model=trained["out"], backend="torch")
    direct.index(catalog)
    scout = ToolScout.from_tools(catalog, retriever="mlc", model=str(trained["out"]), backend="torch",
                                 intents=None)  # the retriever's own scores: no multi-request merge
    scout.save(tmp_path / "index")
    loaded = ToolScout.load(tmp_path / "index")
    a, b = direct.search(QUERIES, k=10), loaded.retrieve(QUERIES, k=10)
    for q in range(len(QUERIES)):
        assert list(a.ids[q]) == list(b.ids[q])
        np.testing.assert_allclose(a.scores[q], b.scores[q], rtol=0, atol=1e-6)
    assert loaded.retriever.fallback_ids == ["translate", "timer"]


def test_unknown_tools_get_the_calibrated_dense_fallback(trained):
    encoder = trained["encoder"]
    calibration = _config(trained["out"])["fallback_calibration"]
    retriever = MLCRetriever(model=trained["out"], encoder=encoder)
    with pytest.warns(UserWarning) as said:
        retriever.index(trained["set"].tools + NEW_TOOLS)
    assert [str(w.message) for w in said] == [
        "the MLC head knows 8 of the catalog's 10 tools (it was trained on the labels of 8 tools); the other 2 are "
        "scored by dense retrieval with its fine-tuned encoder (calibrated cosine), not by the classifier"]
    assert retriever.fallback_ids == ["translate", "timer"] and retriever.unscored_ids == []
    res = retriever.search(["translate this text into French"], k=10)
    got = dict(zip(res.ids[0], res.scores[0]))
    assert len(got) == 10
    cosine = encoder.encode(["translate this text into French"]) @ encoder.encode([tool_text(t) for t in NEW_TOOLS]).T
    for tool, cos in zip(NEW_TOOLS, cosine[0]):
        expected = 1 / (1 + math.exp(-(calibration["slope"] * cos + calibration["intercept"])))
        assert got[tool.id] == pytest.approx(expected, abs=1e-6)

    # a catalog the model never saw: the ranking is dense retrieval with the fine-tuned encoder
    unseen = NEW_TOOLS + [Tool("music", "play_song", "Play a song by an artist."),
                          Tool("lights", "dim_lights", "Turn the smart lights in a room on, off or dim them.")]
    with pytest.warns(UserWarning, match="knows 0 of the catalog's 4 tools .*; the other 4 are scored by dense"):
        retriever.index(unseen)
    dense = DenseRetriever(encoder=encoder)
    dense.index(unseen)
    queries = ["play something by Queen", "switch off the kitchen lights", "translate hello to Spanish"]
    assert retriever.search(queries, 4).as_lists() == dense.search(queries, 4).as_lists()
    # a tool joining a served catalog is logged, not warned: a server adding tools one write at a time would
    # print the line at every write
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retriever.add([Tool("tides", "tide_times", "High and low tide times for a harbour.")])
    assert "tides" in retriever.fallback_ids


def test_without_fallback_unknown_tools_are_never_returned_and_a_warning_says_so(trained):
    retriever = MLCRetriever(model=trained["out"], fallback=None, encoder=trained["encoder"])
    with pytest.warns(UserWarning, match="knows 8 of the catalog's 10 tools .*; the other 2 cannot be scored"):
        retriever.index(trained["set"].tools + NEW_TOOLS)
    assert retriever.unscored_ids == ["translate", "timer"]
    res = retriever.search(["translate this text into French", "start a timer"], k=50)
    assert all(len(ids) == 8 and not {"translate", "timer"} & set(ids) for ids in res.ids)
    retriever.remove(["translate"])
    assert retriever.unscored_ids == ["timer"] and len(retriever) == 9


@pytest.mark.filterwarnings("ignore:the MLC head knows")  # said, and tested, above
def test_filters_add_and_remove(trained):
    retriever = MLCRetriever(model=trained["out"], encoder=trained["encoder"])
    retriever.index(trained["set"].tools + NEW_TOOLS)
    res = retriever.search(QUERIES, 10, Filter.make(namespaces=["travel", "lang"]))
    assert all(set(ids) == {"flight", "hotel", "translate"} for ids in res.ids)
    res = retriever.search(QUERIES, 10, Filter.make(ids=["weather", "timer", "nope"], exclude_ids=["timer"]))
    assert all(list(ids) == ["weather"] for ids in res.ids)
    retriever.remove(["weather", "translate"])
    retriever.add([Tool("weather", "get_weather", "changed text, same id", namespace="other")])
    res = retriever.search(["will it rain in Rome"], 1, Filter.make(namespaces=["other"]))
    assert list(res.ids[0]) == ["weather"]  # a known id keeps its trained head row, whatever its text


def test_eval_harness_runs_on_a_set_whose_tools_it_never_saw(trained):
    from toolscout.eval import evaluate

    unseen = BenchmarkSet("unseen", NEW_TOOLS, [Query("u1", "translate this sentence to German", ("translate",)),
                                                Query("u2", "count down ten minutes", ("timer",))])
    report = evaluate([unseen, trained["set"]],
                      lambda tools: ToolScout.from_tools(tools, retriever="mlc", model=str(trained["out"]),
                                                         encoder=trained["encoder"]),
                      k=2, progress=False)
    assert report.sets["unseen"].metrics["ndcg@2"] == pytest.approx(100.0)  # metrics are in points
    assert report.sets["toy"].metrics["ndcg@2"] > 80
    # what scored the unseen set is said, for that set only (every toy tool is in the head)
    assert report.warnings == ["system: unseen: the MLC head knows 0 of the catalog's 2 tools (it was trained on the "
                               "labels of 8 tools); the other 2 are scored by dense retrieval with its fine-tuned "
                               "encoder (calibrated cosine), not by the classifier"]


def test_index_and_eval_commands_say_which_tools_the_head_cannot_score(trained, tmp_path, capsys):
    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in NEW_TOOLS]))
    assert main(["index", str(catalog), "--retriever", "mlc", "--model", str(trained["out"]), "-o", "backend=torch",
                 "--out", str(tmp_path / "index"), "--quiet"]) == 0
    said = "the MLC head knows 0 of the catalog's 2 tools (it was trained on the labels of 8 tools); the other 2 are"
    assert f"warning: {said} scored by dense retrieval" in capsys.readouterr().err

    write_benchmark(tmp_path / "unseen", NEW_TOOLS, [Query("u1", "translate this sentence", ("translate",))])
    assert main(["eval", str(tmp_path / "unseen"), "--retriever", "mlc", "-o", "backend=torch", "--model",
                 str(trained["out"]), "-k", "2", "--quiet", "--json", str(tmp_path / "eval.json")]) == 0
    assert f"warning: mlc[backend=torch]: unseen: {said} scored" in capsys.readouterr().err
    assert json.loads((tmp_path / "eval.json").read_text())["warnings"] == [
        f"mlc[backend=torch]: unseen: {said} scored by dense retrieval with its fine-tuned encoder (calibrated cosine), not by the "
        "classifier"]


def test_a_pipeline_refuses_a_retrained_model_and_errors_name_the_fix(trained, tmp_path):
    scout = ToolScout.from_tools(trained["set"].tools, retriever="mlc", model=str(trained["out"]),
                                 encoder=trained["encoder"])
    scout.save(tmp_path / "index")
    config = _config(trained["out"])
    # simulate a retrain: the model directory now holds a newer version
    live = resolve(trained["out"])
    newer = live.with_name("v999999")
    newer.symlink_to(live, target_is_directory=True)
    (trained["out"] / "CURRENT").write_text("v999999\n")
    try:
        with pytest.raises(ArtifactError, match="re-index"):
            ToolScout.load(tmp_path / "index")
    finally:
        (trained["out"] / "CURRENT").write_text(live.name + "\n")
        newer.unlink()
    assert config["method"] == "mlc"
    with pytest.raises(ValueError, match="toolscout train mlc"):
        MLCRetriever()
    with pytest.raises(ArtifactError, match="not an MLC model"):
        MLCRetriever(model=tmp_path)


def test_platt_fit_matches_the_closed_form_for_a_binary_feature():
    # with x in {0, 1} the maximum-likelihood fit reproduces each group's log-odds exactly
    x = np.array([0] * 100 + [1] * 50, dtype=float)
    y = np.array([1] * 10 + [0] * 90 + [1] * 30 + [0] * 20, dtype=bool)
    slope, intercept = fit_platt(x, y)
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert intercept == pytest.approx(logit(0.1), abs=1e-3)
    assert slope == pytest.approx(logit(0.6) - logit(0.1), abs=1e-3)


def test_retraining_a_classifier_pipeline_starts_from_its_fine_tuned_encoder(trained):
    """`--train embed|mlc` on an MLC pipeline fine-tunes further from the MLC's own encoder (the one this
    test loaded from the trained model's folder), not from the default model."""
    from toolscout.train.feedback import _dense_encoder_name

    scout = ToolScout.from_tools(trained["set"].tools, retriever="mlc", model=str(trained["out"]))
    assert _dense_encoder_name(scout) == trained["encoder"].name
    assert str(resolve(trained["out"])) in trained["encoder"].name


def test_fine_tuning_that_validates_below_the_probe_is_discarded_and_the_summary_says_so():
    """The probe validated at 60, fine-tuning's best at 40: the probe's weights are put back, and the run
    summary (whose note ends the CLI's last line) says fine-tuning was discarded; one that beats the probe
    carries no note."""
    import torch

    from toolscout.train.loop import RunSummary, TrainConfig
    from toolscout.train.mlc import _fine_tune

    class Worsening:  # a fine-tuning run: moves the weights, validates at `best`
        def __init__(self, net, best):
            self.net, self.best, self.config = net, best, TrainConfig()

        def fit(self, resume):
            with torch.no_grad():
                self.net.weight.add_(1.0)
            return RunSummary("mlc", best_validation=self.best, best_step=3)

    for fine_tuned_best, discarded in ((40.0, True), (80.0, False)):
        net = torch.nn.Linear(2, 2)
        probe_weights = net.weight.detach().clone()
        summary, kept = _fine_tune(Worsening(net, fine_tuned_best), net, lambda: 60.0, RunSummary("mlc-probe"),
                                   [], resume=False)
        assert torch.equal(net.weight, probe_weights) is discarded
        if discarded:
            assert kept.startswith("probe") and summary.best_validation == 60.0 and summary.best_step == 0
            assert summary.discarded_for == ("fine-tuning discarded: the linear probe it started from validated "
                                             "better and was kept")
        else:
            assert kept == "fine-tuned" and summary.discarded_for is None and summary.best_validation == 80.0

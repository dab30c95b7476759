"""Learning from use: the ledger's rules (what is taught, by whom, when), the pipeline's learn / forget /
save around it, heavier learning and the `toolscout learn` command. The learned channel itself:
tests/test_learning.py."""

import json
import re
import shutil
import time

import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.errors import InvalidRequest
from toolscout.feedback import FeedbackEvent, Usage, UsageLedger, events_from_jsonl

RAIN = "will it rain in Bergen tomorrow"
SKY = "is the sky going to be cloudy over Oslo"


def ev(query, *tool_ids, source="a", outcome=None, time=None):
    return FeedbackEvent(query, tool_ids, source, outcome, time)


def queries(usages):
    return [u.query for u in usages]


# ------------------------------------------------------------------------------------ ledger

def test_the_ledger_counts_repeats_once_caps_each_source_and_learns_nothing_from_failures():
    ledger = UsageLedger(per_source_cap=2)
    result = ledger.add([ev(RAIN, "w"), ev("  Will it RAIN in bergen   tomorrow ", "w"),  # the same task again
                         ev(SKY, "w", "x"), ev("third task for w", "w"),  # w's third from source a: capped
                         ev("third task for w", "w", source="b"),  # another source has its own cap
                         ev("this did not work", "w", outcome="failure")])
    assert [(u.tool_id, u.source, u.query) for u in result.learned] == [
        ("w", "a", RAIN), ("w", "a", SKY), ("x", "a", SKY), ("w", "b", "third task for w")]
    assert (result.events, result.duplicates, result.capped, result.failures) == (6, 1, 1, 1)
    assert [(source, queries(u)) for source, u in ledger.usage("w")] == [("a", [RAIN, SKY]), ("b", ["third task for w"])]
    assert ledger.summary("w") == {"learned": 3, "sources": 2, "reported": 6}
    # the capped request stays counted: posting it again is a repeat, not a new try at the cap
    assert ledger.add([ev("third task for w", "w")]).duplicates == 1
    assert sorted({u.tool_id for u in ledger.forget("a")}) == ["w", "x"]
    assert [(source, queries(u)) for source, u in ledger.usage("w")] == [("b", ["third task for w"])]
    assert ledger.usage("x") == []
    assert ledger.add([ev(RAIN, "w")]).learned == [Usage("w", "a", RAIN)]  # forgotten: may teach again


def test_the_ledger_round_trips_and_rejects_bad_events(tmp_path):
    ledger = UsageLedger(per_source_cap=1)
    ledger.add([ev(RAIN, "w"), ev(SKY, "w"), ev("x", "y", source="b", outcome="failure")])
    ledger.save(tmp_path / "f.json")
    again = UsageLedger.load(tmp_path / "f.json")
    assert again.taught() == ledger.taught() and again.summary("w") == ledger.summary("w")
    assert (again.events, again.failures, again.per_source_cap) == (3, 1, 1)
    assert again.add([ev(SKY, "w")]).duplicates == 1  # the capped key survives the round trip
    with pytest.raises(InvalidRequest, match="tool_ids"):
        FeedbackEvent("task", ())
    with pytest.raises(InvalidRequest, match="outcome"):
        FeedbackEvent("task", ("w",), outcome="meh")
    with pytest.raises(InvalidRequest, match="unknown field"):
        FeedbackEvent.from_dict({"query": "q", "tool_ids": ["w"], "tools": ["w"]})
    with pytest.raises(InvalidRequest, match="'time' must be seconds since the epoch"):
        FeedbackEvent.from_dict({"query": "q", "tool_ids": ["w"], "time": "yesterday"})
    for field, event in (("query", {"query": "rain \ud800", "tool_ids": ["w"]}),  # learn() failed in hashing it
                         ("tool_ids", {"query": "rain", "tool_ids": ["w", "\udfff"]}),
                         ("source", {"query": "rain", "tool_ids": ["w"], "source": "s\udc80"})):
        with pytest.raises(InvalidRequest, match=rf"^feedback: '{field}': a lone surrogate \(\\ud800 to \\udfff\)"):
            FeedbackEvent.from_dict(event)
    log = tmp_path / "log.jsonl"
    log.write_text('{"query": "q", "tool_ids": ["w"]}\n\n{"query": "", "tool_ids": ["w"]}\n')
    with pytest.raises(InvalidRequest, match=r"log.jsonl:3: feedback: 'query'"):
        events_from_jsonl(log)


def test_the_ledger_keeps_when_and_untaught_rank_and_rolls_back_to_a_time(tmp_path):
    ledger = UsageLedger()
    ledger.add([ev(RAIN, "w", time=10.0), ev(SKY, "w", time=20.0), ev("late one", "x", source="b", time=30.0)],
               untaught={(RAIN, "w"): 3, (SKY, "w"): None})
    assert [(u.query, u.time, u.untaught_rank) for _s, usages in ledger.usage("w") for u in usages] == \
        [(RAIN, 10.0, 3), (SKY, 20.0, None)]
    ledger.save(tmp_path / "f.json")
    again = UsageLedger.load(tmp_path / "f.json")
    assert [(u.query, u.time, u.untaught_rank) for u in again.taught()] == \
        [(u.query, u.time, u.untaught_rank) for u in ledger.taught()]
    removed = again.rollback(20.0)
    assert sorted(queries(removed)) == sorted(["late one", SKY])
    assert queries(again.taught()) == [RAIN]
    assert again.add([ev(SKY, "w", time=40.0)]).learned  # taken back: it may teach again


def test_a_ledger_saved_before_times_were_kept_still_loads(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"per_source_cap": 3, "events": 2, "failures": 0, "reported": {"w": 2},
                                "entries": {"w": {"a": [RAIN, SKY]}}, "capped_keys": [["a", "w", "third"]]}))
    ledger = UsageLedger.load(path)
    assert [(u.query, u.time, u.untaught_rank) for u in ledger.taught()] == [(RAIN, 0.0, None), (SKY, 0.0, None)]
    assert ledger.add([ev("third", "w")]).duplicates == 1


def test_a_tool_edit_keeps_its_feedback_and_a_delete_drops_it(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools, encoder=encoder)
    scout.learn([ev(RAIN, "stocks.quote")])
    edited = scout.get("stocks.quote").with_changes(description="Share prices and market data.")
    scout.add([edited])
    assert scout.ledger.summary("stocks.quote")["learned"] == 1 and "stocks.quote" in scout.learning.memory.tools
    scout.save(tmp_path / "idx")
    loaded = ToolScout.load(tmp_path / "idx")
    assert loaded.retrieve([RAIN], 3).as_lists() == scout.retrieve([RAIN], 3).as_lists()
    assert loaded.ledger.summary("stocks.quote") == scout.ledger.summary("stocks.quote")
    loaded.remove(["stocks.quote"])
    assert loaded.ledger.summary("stocks.quote")["learned"] == 0
    assert "stocks.quote" not in loaded.learning.memory.tools


def test_a_directory_that_learned_the_old_way_gets_its_own_vectors_back_and_its_requests_relearned(tools, encoder,
                                                                                                   tmp_path):
    """Before learning was a channel of its own, feedback moved the dense vectors of taught tools and kept
    their own vectors aside (`learned.npz`): loading such a directory puts them back, and the channel learns
    the ledger's requests again."""
    scout = ToolScout.from_tools(tools, encoder=encoder)
    scout.learn([ev(RAIN, "stocks.quote")])
    scout.save(tmp_path / "idx")
    folder = next((tmp_path / "idx").glob("v*"))
    dense = folder / "retriever" / "component1" / "store"
    ids = json.loads((dense / "ids.json").read_text())["ids"]
    vectors = np.load(dense / "vectors.npy")
    row = ids.index("stocks.quote")
    own = vectors[row].copy()
    vectors[row] = own[::-1]  # what a blend had made of it
    np.save(dense / "vectors.npy", vectors)
    np.savez(dense.parent / "learned.npz", own_ids=np.asarray(["stocks.quote"]), own=own[None, :])
    shutil.rmtree(folder / "learning")
    loaded = ToolScout.load(tmp_path / "idx")
    np.testing.assert_array_equal(loaded.retriever.components[1].store.get(["stocks.quote"])[0], own)
    assert "stocks.quote" in loaded.learning.memory.tools
    assert loaded.learning.memory.pairs() == scout.learning.memory.pairs()


# ------------------------------------------------------------------------- heavier learning (opt-in)

SAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / \
    "apibank_sample"


def sample_with_feedback(encoder, retriever="hybrid"):
    """The sample catalog taught its queries; `retriever` None: the default pipeline (calibrated)."""
    from toolscout.benchmark_sets import load_benchmark

    bench = load_benchmark(SAMPLE)
    options = {} if retriever == "bm25" else {"encoder": encoder}
    if retriever is not None:
        options["retriever"] = retriever
    scout = ToolScout.from_tools(bench.tools, **options)
    scout.learn([FeedbackEvent(q.text, q.labels, "app") for q in bench.queries if q.labels])
    return scout


def test_a_retrained_copy_keeps_the_freeze_the_weights_set_by_hand_the_weight_history_and_the_scores(encoder,
                                                                                                     tmp_path):
    """The copy a retraining judges and may swap in learned afresh under default settings: a freeze was
    lifted (what it held got taught), weights set by hand went back to automatic, and the history and the
    scores the automatic weights read were lost (review). Only what was learned is learned again."""
    from toolscout.train.feedback import _learned_copy

    scout = sample_with_feedback(encoder)
    namespace = scout.tools[0].namespace  # the sample's tools have none: "*" weighs them
    scout.set_learning(weights={"*": 0.5}, freeze=True)
    scout.learning.weight_history = [{"time": 1.0, "namespace": namespace, "from": 1.0, "to": 0.9, "why": "worse"}]
    copy = _learned_copy(scout, tmp_path / "copy", lambda _query: True, None, None)
    assert copy.learning.settings == scout.learning.settings and copy.learning.settings.frozen_at is not None
    assert copy.learning.weight(namespace) == 0.5
    assert copy.learning.weight_history == scout.learning.weight_history
    assert copy.learning.scorecard.records == scout.learning.scorecard.records
    assert copy.learning.memory.pairs() == scout.learning.memory.pairs()


@pytest.mark.slow  # trains
@pytest.mark.usefixtures("torch_encoders")
def test_retraining_scores_both_pipelines_on_held_back_feedback_and_swaps_only_a_better_one(encoder, tmp_path):
    from toolscout.train.feedback import feedback_queries, held_back, retrain
    from toolscout.train.loop import TrainConfig, validation_ndcg

    scout = sample_with_feedback(encoder)
    before = scout.retrieve(["check my calendar for tomorrow"], 5).as_lists()
    result = retrain(scout, "mlc", tmp_path / "work", config=TrainConfig(max_steps=3, batch_size=8, progress=False),
                     probe_epochs=2, max_seq_length=32, validate_at_start=False)
    queries = feedback_queries(scout)
    test = [q for q in queries if held_back(q, 0.2)]
    assert (result.train_queries, result.holdout_queries) == (len(queries) - len(test), len(test))
    # oracle for the baseline: a fresh pipeline that learned only the requests not held back
    fresh = ToolScout.from_tools(scout.tools, retriever="hybrid", encoder=encoder)
    held = {q.text for q in test}
    fresh.learn([FeedbackEvent(u.query, (u.tool_id,), u.source) for u in scout.ledger.taught() if u.query not in held])
    assert result.baseline == pytest.approx(validation_ndcg(lambda t, k: fresh.retrieve(t, k), test), abs=1e-9)
    assert result.improved == (result.candidate > result.baseline)
    assert scout.retrieve(["check my calendar for tomorrow"], 5).as_lists() == before  # the original is untouched
    if result.improved:  # the swapped-in pipeline learned every request, under the original sources
        assert result.scout.ledger.taught() == scout.ledger.taught()
        assert result.scout.learning.memory.pairs() == scout.learning.memory.pairs()
        assert result.scout.retriever.components[1].name == "mlc"


@pytest.mark.slow  # trains
@pytest.mark.usefixtures("torch_encoders")
def test_a_retrained_model_is_kept_with_the_index_that_refers_to_it(encoder, tmp_path, monkeypatch):
    """The swapped-in pipeline refers to the model a retraining wrote; it was written in a temporary folder,
    so an index served after that folder was cleaned away (a reboot) would not load."""
    import shutil

    import toolscout.train.feedback as heavy
    from toolscout.serve import ToolService
    from toolscout.train.loop import TrainConfig

    folder = tmp_path / "idx"
    sample_with_feedback(encoder).save(folder)
    scratch = tmp_path / "scratch"
    mkdtemp = heavy.tempfile.mkdtemp
    monkeypatch.setattr(heavy.tempfile, "mkdtemp", lambda prefix=None, **kw: str(scratch)
                        if prefix == "toolscout-retrain-" else mkdtemp(prefix=prefix, **kw))
    scores = iter([10.0, 20.0])  # held-back nDCG: the baseline, then the candidate, which wins
    monkeypatch.setattr(heavy, "validation_ndcg", lambda search, queries: next(scores))
    with ToolService.open(folder, fsync=False) as service:
        service.storage.retrain("mlc", config=TrainConfig(max_steps=2, batch_size=8, progress=False),
                                probe_epochs=1, max_seq_length=32, validate_at_start=False)
        assert service.storage.scout.retriever.components[1].name == "mlc"
    shutil.rmtree(scratch)
    models = [p.name for p in (folder / "models").iterdir()]
    assert len(models) == 1 and models[0].startswith("mlc-")
    reopened = ToolScout.load(folder)
    assert reopened.retriever.components[1].name == "mlc" and reopened.search("check my calendar", k=3)


def test_a_retraining_is_swapped_in_with_the_writes_made_while_it_trained(encoder, tmp_path, monkeypatch):
    """The swap itself, with a stand-in trainer: a candidate that scores better replaces the pipeline, and
    a tool written (and feedback given) while it trained is in the new pipeline too; a worse one changes
    nothing."""
    import toolscout.serve.directory as directory
    import toolscout.train.feedback as heavy
    from toolscout.serve import ToolService
    from toolscout.tool import Tool

    folder = tmp_path / "idx"
    sample_with_feedback(encoder, retriever="bm25").save(folder)
    service = ToolService.open(folder, fsync=False)
    other = sample_with_feedback(encoder, retriever="bm25")  # "the trained pipeline": a distinct object

    def fake(scout, method, workdir=None, model_dir=None, **options):  # writes land while "training" runs
        (model_dir / "weights").mkdir(parents=True)  # the model it trained, kept with the index
        tool_id = f"late.tool{int(score)}"
        service.upsert([Tool(tool_id, "late_tool", "Arrived while the model trained.", namespace="late")])
        service.feedback([{"query": "a late request about zebras", "tool_ids": [tool_id]}])
        return heavy.Retrained(method, 50.0, score, 10, 3, str(tmp_path / "m"), other if score > 50 else None)

    monkeypatch.setattr(heavy, "retrain", fake)
    score = 40.0
    assert service.retrain("mlc")["state"] == "kept" and service.storage.scout is not other
    assert list((folder / "models").iterdir()) == []  # a model not swapped in is not kept
    score = 60.0
    state = service.retrain("mlc")
    assert state["state"] == "swapped" and service.storage.scout is other
    assert other.get("late.tool60", None) is not None and other.ledger.summary("late.tool60")["learned"] == 1
    # a retraining that ends within the same second and is not swapped in leaves the served model alone
    served = list((folder / "models").iterdir())
    with monkeypatch.context() as within_that_second:
        def kept(scout, method, workdir=None, model_dir=None, **_):  # a real trainer writes into model_dir
            model_dir.mkdir(parents=True, exist_ok=True)
            return heavy.Retrained(method, 50.0, 40.0, 10, 3, str(model_dir), None)

        within_that_second.setattr(heavy, "retrain", kept)
        stamp = served[0].name.removeprefix("mlc-")
        within_that_second.setattr(directory.time, "strftime", lambda fmt, t=None: stamp)
        assert service.retrain("mlc")["state"] == "kept" and list((folder / "models").iterdir()) == served
    service.close()
    again = ToolService.open(folder)  # the swap was saved
    assert again.get("late.tool60").name == "late_tool" and again.feedback_of("late.tool60")["learned"] == 1
    # a retraining with no write journalled since the last snapshot (a server just restarted) is saved too
    quiet = sample_with_feedback(encoder, retriever="bm25")
    quiet.add([Tool("quiet.tool", "quiet_tool", "Only the retrained pipeline has it.", namespace="quiet")])
    monkeypatch.setattr(heavy, "retrain", lambda scout, method, workdir=None, **options: heavy.Retrained(
        method, 50.0, 70.0, 10, 3, str(tmp_path / "m"), quiet))
    assert again.storage.journal.records == 0 and again.retrain("mlc")["state"] == "swapped"
    again.close(compact=False)  # as if killed right after
    with ToolService.open(folder) as reopened:
        assert reopened.get("quiet.tool").name == "quiet_tool"


def test_cli_learn_imports_logs_forgets_sources_and_refuses_a_served_directory(encoder, tmp_path, capsys):
    import json

    from toolscout.cli import main

    folder = tmp_path / "idx"
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(e) for e in [
        {"query": "put a meeting with Ann in my calendar", "tool_ids": ["apibank::AddMeeting"]},
        {"query": "put a meeting with Ann in my calendar", "tool_ids": ["apibank::AddMeeting"]},
        {"query": "remind me of the dentist", "tool_ids": ["apibank::AddReminder"], "source": "app-2"},
        {"query": "book a taxi", "tool_ids": ["taxi.book", "apibank::Nope"], "source": "app-2"},
        {"query": "book a cab", "tool_ids": ["taxi.book"], "source": "app-2"},
        {"query": "2026-11-11 10:47", "tool_ids": ["apibank::AddReminder"], "source": "app-2"}]) + "\n")
    assert main(["learn", str(folder), str(log)]) == 0
    said = capsys.readouterr().err
    assert ("6 events: 2 (tool, request) pairs learned, 1 whose request is only numbers, dates or addresses (they "
            "teach nothing), 1 repeats") in said
    assert "3 unknown tool ids (2 distinct: 'taxi.book', 'apibank::Nope')" in said
    scout = ToolScout.load(folder)
    assert scout.ledger.sources() == {"app-2": 1, "import": 1}
    capsys.readouterr()
    assert main(["learn", str(folder), "--forget", "app-2"]) == 0
    assert ToolScout.load(folder).ledger.sources() == {"import": 1}
    # what "as before" meant, said (trial 10 #10): the tools it taught (AddReminder; taxi.book is unknown)
    assert "forgot source 'app-2': the 1 tools it had taught rank as if it had never posted" in capsys.readouterr().err
    version = (folder / "CURRENT").read_text()
    capsys.readouterr()
    assert main(["learn", str(folder), "--forget", "nobody"]) == 0  # no such source: said, and nothing written
    assert "source 'nobody' has no feedback stored here (a typo?): nothing was taken back" in capsys.readouterr().err
    assert (folder / "CURRENT").read_text() == version
    from toolscout.serve import ToolService

    with ToolService.open(folder):
        assert main(["learn", str(folder), str(log)]) == 1
        said = capsys.readouterr().err  # and the way through the server (trial 10 #8)
        assert "another toolscout server is serving this directory" in said
        assert 'or post the log to the server: POST http://HOST:PORT/feedback {"events": [...]}' in said
        assert main(["learn", str(folder), "--forget", "app-2"]) == 1
        assert "or ask the server: DELETE http://HOST:PORT/feedback?source=SOURCE" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["learn", str(folder), str(tmp_path / "empty.jsonl")]) == 0
    assert f"no feedback events in {tmp_path / 'empty.jsonl'}: nothing learned" in capsys.readouterr().err
    # frozen: events a log dates before the freeze would be learned at once, so the import is refused
    assert main(["learning", "freeze", str(folder)]) == 0
    assert capsys.readouterr().err.startswith("freeze: learning is frozen since ")
    pets = tmp_path / "pets"
    assert main(["index", str(SAMPLE.parent / "petstore_openapi.yaml"), "--out", str(pets), "--retriever", "bm25"]) == 0
    capsys.readouterr()
    assert main(["learning", "weight", str(pets), "swagger-petstore-openapi-3-0", "0.5"]) == 0  # one it has
    said = capsys.readouterr().err
    assert "weights set by hand: 'swagger-petstore-openapi-3-0' 0.50" in said and "warning" not in said, said
    assert main(["learning", "weight", str(pets), "swagger-petstore", "0.5"]) == 0
    assert "warning: no tool is in namespace 'swagger-petstore' now (a typo?)" in capsys.readouterr().err
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"query": "remind me to call Bo", "tool_ids": ["apibank::AddReminder"],
                               "time": 1_000_000_000}) + "\n")
    capsys.readouterr()
    assert main(["learn", str(folder), str(old)]) == 1
    assert "learning is frozen since" in capsys.readouterr().err
    assert ToolScout.load(folder).ledger.sources() == {"import": 1}
    # frozen: an undated log is recorded, and said to be, not learned
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_text(json.dumps({"query": "water the plants", "tool_ids": ["apibank::AddReminder"]}) + "\n")
    assert main(["learn", str(folder), str(fresh)]) == 0
    said = capsys.readouterr().err
    assert "1 events: 0 (tool, request) pairs learned, 1 held back by the freeze" in said, said
    assert "learning is frozen: these events were recorded but not learned" in said


def test_cli_learn_train_says_what_runs_and_shows_the_trainers_progress(encoder, tmp_path, capsys, monkeypatch):
    """A retraining takes minutes: the command says what it does and the trainer shows its progress (it was
    silent until the verdict), unless --quiet; a setting given with -o still wins."""
    import toolscout.train.feedback as heavy
    from toolscout.cli import main

    folder = tmp_path / "idx"
    sample_with_feedback(encoder, retriever="bm25").save(folder)
    seen = []

    def trainer(scout, method, workdir=None, model_dir=None, **options):  # the options a real one would get
        seen.append(options)
        return heavy.Retrained(method, 50.0, 40.0, 10, 3, str(model_dir), None)

    monkeypatch.setattr(heavy, "retrain", trainer)
    assert main(["learn", str(folder), "--train", "mlc"]) == 0
    assert "training mlc on the feedback so far" in capsys.readouterr().err
    assert main(["learn", str(folder), "--train", "mlc", "--quiet"]) == 0
    assert main(["learn", str(folder), "--train", "mlc", "-o", "progress=false", "-o", "max_steps=3"]) == 0
    assert seen == [{"progress": True}, {"progress": False}, {"progress": False, "max_steps": 3}]


def test_a_swap_to_a_pipeline_without_calibration_says_probabilities_and_abstention_are_off(encoder, tmp_path, capsys,
                                                                                               caplog, monkeypatch):
    """The calibration fits the pipeline it came with: a retrained one swapped in has none, so hits lose
    their probability and min_probability abstains on nothing. `learn --train` and `POST /admin/learn` (its
    state and the server's log) say so, as `serve --min-probability` does at start-up."""
    import logging

    from gateways import wait_for
    from starlette.testclient import TestClient

    import toolscout.train.feedback as heavy
    from toolscout.cli import main
    from toolscout.serve import ToolService, create_app
    from toolscout.serve.auth import AuthConfig

    calibrated = sample_with_feedback(encoder, retriever=None)  # the default pipeline
    gibberish = "qwxzv plork zzkk"
    assert calibrated.search(gibberish, min_probability="calibrated") == []
    folder, served = tmp_path / "idx", tmp_path / "served"
    calibrated.save(folder)
    calibrated.save(served)
    retrained = ToolScout.from_tools(calibrated.tools, retriever="dense", encoder=encoder)  # uncalibrated
    monkeypatch.setattr(heavy, "retrain", lambda scout, method, workdir=None, model_dir=None, **options:
                        heavy.Retrained(method, 40.0, 50.0, 10, 3, str(model_dir), retrained))
    assert main(["learn", str(folder), "--train", "mlc", "--quiet"]) == 0
    said = capsys.readouterr().err
    assert "swapped in\nwarning: the mlc pipeline swapped in has no calibration" in said
    assert "hits carry no probability, and no search abstains on probability" in said
    swapped = ToolScout.load(folder)  # what the warning says, indeed
    assert swapped.search(gibberish, min_probability="calibrated") != []
    assert swapped.search("add a meeting to my calendar", k=1)[0].probability is None

    with ToolService.open(served, fsync=False) as service, caplog.at_level(logging.WARNING):
        client = TestClient(create_app(service, AuthConfig.build("admin", None, False)))
        admin = {"authorization": "Bearer admin"}
        assert client.post("/admin/learn", json={"train": "mlc"}, headers=admin).status_code == 202
        state = wait_for(lambda: (s := client.get("/admin/learn", headers=admin).json())["state"] != "running" and s,
                         "the retraining to finish", 30)
        assert state["state"] == "swapped" and "has no calibration" in state["warning"]
        assert any("retraining: the mlc pipeline swapped in has no calibration" in m for m in caplog.messages)


def test_cli_learning_says_what_a_target_that_is_no_toolscout_is(tmp_path, capsys):
    """Another web server's 404 page was printed whole, its JSON read as "Expecting value", a gateway's /mcp
    URL got no hint, ftp://... was read as a directory, and a tokens file as a gateway config (trial 10 #7)."""
    import functools
    import http.server
    import json
    import threading

    from toolscout.cli import main

    site = tmp_path / "www"
    site.mkdir()
    (site / "learning").write_text('{"hello": 1}')  # JSON, but not a learning report
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"admin": {"write": True}}))
    try:
        for target, says in ((f"{url}/nothing", "/nothing/learning: HTTP 404, not a toolscout server's answer "
                                                "(text/html); give a toolscout server's URL (http://HOST:PORT)"),
                             (url, "/learning: JSON without requests, tools_taught, events_scored, measured, "
                                   "weights: not a toolscout server's learning report"),
                             (f"{url}/mcp", f"{url}/mcp is an MCP endpoint: give the server's URL without /mcp "
                                            f"({url})"),
                             ("ftp://example.com", "ftp://example.com: unsupported scheme 'ftp'; give a pipeline "
                                                   "directory"),
                             (str(tokens), f"{tokens}: a file, but not a gateway config (no \"mcpServers\" section)")):
            assert main(["learning", "report", target]) == 1, target
            said = capsys.readouterr().err
            assert says in said and "<html" not in said.lower() and "Expecting value" not in said, said
        assert main(["learning", "freeze", "ftp://example.com"]) == 1  # every verb reads its target so
        assert "unsupported scheme 'ftp'" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


def test_cli_learning_reports_beside_a_server_and_refuses_bad_arguments_before_changing_anything(encoder, tmp_path,
                                                                                                  capsys):
    import json
    import socket

    from toolscout.cli import main
    from toolscout.serve import ToolService

    folder = tmp_path / "idx"
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    with ToolService.open(folder) as service:  # a server (a stdio gateway has no URL) holds the directory
        service.feedback([FeedbackEvent("put a meeting with Ann in my calendar", ("apibank::AddMeeting",))])
        capsys.readouterr()
        assert main(["learning", "report", str(folder), "--json"]) == 0  # read beside it: its journal's feedback
        assert json.loads(capsys.readouterr().out)["events_scored"] == 1
        assert main(["learning", "report", str(folder)]) == 0  # the table: one event, scored before anything
        table = capsys.readouterr().out.splitlines()  # was learned, so every ranking put its tool in one place
        header = next(i for i, line in enumerate(table) if line.startswith("| namespace |"))
        # the table (meaning changed, trial 10: first-seen requests apart from repeats, new tools shown)
        assert table[header].endswith("| repeats: MRR served / untaught | tools new to learning: MRR served / "
                                      "untaught (pairs) | weight |")
        _, ns, events, mrr, _top1, repeats, new, weight, _ = table[header + 2].split("|")
        served, untaught, learned = mrr.split(" / ")
        assert (ns.strip(), events.strip(), weight.strip()) == ("(none)", "1 + 0", "1.00 (automatic)")
        assert served.strip() == untaught.strip() == learned.strip()
        assert repeats.strip() == "-" and new.strip() == f"{served.strip()} / {untaught.strip()} (1)"
        assert any(line.startswith("repeats: the same request again") for line in table[header + 3:])
        assert main(["learning", "freeze", str(folder)]) == 1  # a write still needs the server
        said = capsys.readouterr().err  # which the message says how to use (trial 10 #8)
        assert "another toolscout server" in said and said.rstrip().endswith(
            "stop it first, or run it against the server: toolscout learning freeze http://HOST:PORT (with an "
            "admin --token)")
        assert main(["learning", "rollback", str(folder), "--before", "2026-11-29T13:45:44Z"]) == 1
        assert "toolscout learning rollback http://HOST:PORT --before 2026-11-29T13:45:44Z" in capsys.readouterr().err
    version = (folder / "CURRENT").read_text()
    day_ago_ms = (round(time.time()) - 86_400) * 1000  # whole seconds, in milliseconds
    rollback = ["rollback", str(folder), "--before"]
    for argv, says in (([*rollback, "1e30"], "--before '1e30': in the future (9999-12-31T23:59:59+00:00 or later)"),
                       ([*rollback, "nan"], "--before 'nan': not a time; give an ISO 8601"),
                       ([*rollback, "-1"], "--before '-1': a negative time, before 1970: it would take back "
                                           "everything; give an ISO 8601"),
                       ([*rollback, str(day_ago_ms)], f"(milliseconds? {day_ago_ms // 1000} seconds would be "),
                       ([*rollback, "2999-01-01T00:00:00Z"], "--before '2999-01-01T00:00:00Z': in the future "
                                                             "(2999-01-01T00:00:00+00:00): it would take back nothing"),
                       (["weight", str(folder), "mail", "abc"], "give a number from 0 to 1, or auto"),
                       (["weight", str(folder), "mail", "2"], "weight '2': give a number from 0 to 1, or auto")):
        assert main(["learning", *argv]) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
    assert (folder / "CURRENT").read_text() == version  # refused before anything was written
    # a dry run on the free directory: what would go, from which source, and nothing written (trial 10 #9)
    assert main(["learning", "rollback", str(folder), "--before", "1", "--dry-run"]) == 0
    said = capsys.readouterr().err
    assert said.startswith("would take back 1 (request, tool) pairs learned at or after 1970-01-01T00:00:01+00:00, "
                           "from ") and said.rstrip().endswith("; --dry-run: nothing changed")
    assert (folder / "CURRENT").read_text() == version and ToolScout.load(folder).ledger.events == 1
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["learning", "report", f"http://127.0.0.1:{port}"]) == 1
    assert f"http://127.0.0.1:{port}: cannot reach the server" in capsys.readouterr().err


def test_cli_rollback_dry_run_writes_nothing_even_with_a_journal_and_runs_beside_a_server(encoder, tmp_path, capsys):
    """A dry run reads the directory as its server serves it: a journal left by a server stopped without saving is
    neither replayed into a new snapshot nor emptied (opening the directory for writing did both), and a server
    holding the directory does not stop it (reviewer, session 19)."""
    from toolscout.cli import main
    from toolscout.serve import ToolService

    folder = tmp_path / "idx"
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    service = ToolService.open(folder)
    service.feedback([FeedbackEvent("put a meeting with Ann in my calendar", ("apibank::AddMeeting",))])
    service.close(compact=False)  # as after a crash: the feedback is only in the journal
    journal, version = (folder / "journal.log").read_bytes(), (folder / "CURRENT").read_text()
    assert b"put a meeting with Ann" in journal
    capsys.readouterr()
    assert main(["learning", "rollback", str(folder), "--before", "1", "--dry-run"]) == 0
    assert capsys.readouterr().err.startswith("would take back 1 (request, tool) pairs learned at or after ")
    assert (folder / "journal.log").read_bytes() == journal and (folder / "CURRENT").read_text() == version
    with ToolService.open(folder) as held:  # replays the journal; the dry run reads beside it
        assert main(["learning", "rollback", str(folder), "--before", "1", "--dry-run"]) == 0
        assert capsys.readouterr().err.startswith("would take back 1 (request, tool) pairs")
        assert held.learning()["requests"] == 1  # nothing taken back


def test_a_feedback_log_reads_as_written_and_each_fault_names_the_file_and_line(tmp_path):
    good = '{"query": "book a table", "tool_ids": ["dining.reserve"]}\n'
    log = tmp_path / "bom.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + good.encode())  # a byte-order mark some editors write
    assert [e.tool_ids for e in events_from_jsonl(log)] == [("dining.reserve",)]
    separated = tmp_path / "separator.jsonl"  # U+2028 is a line break to str.splitlines, not to JSON Lines
    separated.write_text(json.dumps({"query": "book\u2028a table", "tool_ids": ["x"]}, ensure_ascii=False) + "\r\n")
    assert [e.query for e in events_from_jsonl(separated)] == ["book\u2028a table"]
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"query": "caf\u00e9", "tool_ids": ["x"]}\n'.encode("latin-1"))
    for path, says in ((latin, f"{latin}: not UTF-8 text (byte 14"), (tmp_path / "missing.jsonl", "missing.jsonl: cannot "
                       "read the feedback log: No such file"), (tmp_path, "cannot read the feedback log: Is a directory")):
        with pytest.raises(InvalidRequest, match=re.escape(says)):
            events_from_jsonl(path)
    for line, says in (('{"query": "q", "tool_ids": "dining.reserve"}', "'tool_ids' must be a list of tool ids"),
                       ('{"query": "q", "tool_ids": ["x"], "time": 1e300}', "'time' must be seconds since the epoch"),
                       ('{"query": "q", "tool_ids": ["x"], "time": Infinity}', "'time' must be seconds since the epoch")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(good + line + "\n")
        with pytest.raises(InvalidRequest, match=re.escape(f"{bad}:2: feedback: {says}")):
            events_from_jsonl(bad)


def test_cli_learn_while_frozen_refuses_a_log_before_writing_any_of_it(encoder, tmp_path, capsys, monkeypatch):
    """A log is imported in batches; the freeze check runs over the whole log first, so a refused import
    records nothing (it used to record the batches before the first old event), and its message counts
    the file's old events, not one batch's."""
    import json
    import time as clock

    from toolscout.cli import learn as learn_cli
    from toolscout.cli import main

    monkeypatch.setattr(learn_cli, "BATCH", 2)  # several batches from a short log, as 1,000 from a long one
    folder = tmp_path / "idx"
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    assert main(["learning", "freeze", str(folder)]) == 0
    now = clock.time() + 1
    log = tmp_path / "mixed.jsonl"
    log.write_text("".join(json.dumps({"query": f"remind me of chore {i}", "tool_ids": ["apibank::AddReminder"],
                                       "source": "mixed", "time": now if i < 4 else now - 86400}) + "\n"
                           for i in range(7)))
    capsys.readouterr()
    assert main(["learn", str(folder), str(log)]) == 1
    said = capsys.readouterr().err
    assert "and 3 of these events are dated before it" in said, said
    scout = ToolScout.load(folder)
    assert scout.ledger.events == 0 and not scout.learning.scorecard.records  # nothing recorded or scored

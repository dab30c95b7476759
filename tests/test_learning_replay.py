"""What a restart after a crash replays of learning from use: the journal of a pipeline directory holds
feedback with the ranks it was scored by, so replaying it searches nothing; the compaction policy counts
the events a record holds; and a replayed weight change is history, kept at its time, not logged as news."""

import logging
import time

from test_feedback import sample_with_feedback
from test_learning import RAIN, WEATHERISH, background, traffic

from toolscout import ToolScout
from toolscout.feedback import FeedbackEvent
from toolscout.serve.directory import DirectoryStorage
from toolscout.serve.journal import Journal


def _taught_directory(encoder, folder):
    ToolScout.from_tools(sample_with_feedback(encoder, "bm25").tools, retriever="bm25").save(folder)
    return [FeedbackEvent(f"remind me of chore {i}", ("apibank::AddReminder",), f"s{i % 3}") for i in range(30)]


def test_replayed_feedback_is_scored_by_its_journalled_ranks_not_searched_again(encoder, tmp_path, monkeypatch):
    """Replay used to score every event again (a search per request: most of a restart's minutes); the ranks
    journalled with the events give the same scorecard and ledger without one."""
    folder = tmp_path / "idx"
    events = _taught_directory(encoder, folder)
    live = DirectoryStorage.open(folder)
    for i in range(0, 30, 10):
        live.learn(events[i:i + 10])
    scored = [r.to_dict() for r in live.scout.learning.scorecard.records]
    ledger = {t: dict(sources) for t, sources in live.scout.ledger.entries.items()}  # with untaught ranks
    live.close(compact=False)  # as a SIGKILL leaves it: three feedback records in the journal

    def no_search(self, queries):
        raise AssertionError(f"replay searched again for {len(queries)} requests")

    monkeypatch.setattr(ToolScout, "score", no_search)
    again = DirectoryStorage.open(folder)
    try:
        assert [r.to_dict() for r in again.scout.learning.scorecard.records] == scored
        assert again.scout.ledger.events == 30 and again.scout.ledger.entries == ledger
    finally:
        again.close(compact=False)


def test_one_big_feedback_record_counts_its_events_toward_a_compaction(encoder, tmp_path):
    """--compact-every counted journal records, so one POST of 10,000 events weighed as one write and a
    journal of a few huge records never compacted (each restart replayed all of it)."""
    folder = tmp_path / "idx"
    events = _taught_directory(encoder, folder)
    storage = DirectoryStorage.open(folder, compact_every=25)
    storage.learn(events)  # one record, 30 events
    storage.close(compact=False)  # waits for a compaction it started; makes none of its own
    assert [r["op"] for r in Journal(folder).read()] == ["base"]
    assert ToolScout.load(folder).ledger.events == 30


def test_a_journal_replayed_at_open_is_compacted_so_the_next_crash_replays_nothing(encoder, tmp_path):
    folder = tmp_path / "idx"
    events = _taught_directory(encoder, folder)
    live = DirectoryStorage.open(folder)
    live.learn(events)
    live.close(compact=False)
    again = DirectoryStorage.open(folder)
    again.close(compact=False)  # as a second crash, right after the restart's compaction
    assert [r["op"] for r in Journal(folder).read()] == ["base"]
    assert ToolScout.load(folder).ledger.events == 30


def test_a_replayed_weight_change_is_history_at_its_time_not_news(encoder, tmp_path, caplog):
    """The scenario of test_learning's weight test, served from a directory: the automatic weight of
    'advice' goes down while it learns (logged then, and kept in the report's history with its time). A
    restart that replays the journal, and `learning report DIR`, used to log it again as if it happened
    now, and the report had no history at all."""
    from toolscout.cli.learn import render_report
    from toolscout.serve.held import current_pipeline

    folder = tmp_path / "idx"
    ToolScout.from_tools(WEATHERISH, encoder=encoder).save(folder)
    live = DirectoryStorage.open(folder)
    live.learn(traffic(RAIN, "advice.umbrella", 60) + background())
    started = time.time()
    with caplog.at_level(logging.WARNING):
        for event in traffic(RAIN, "weather.forecast", 60, source="agent-2", start=1000.0):
            live.learn([event])
    assert "learning in namespace 'advice': weight 1.00 ->" in caplog.text
    history = live.scout.learning_report()["weight_history"]
    assert history and all(started <= h["time"] <= time.time() for h in history)
    assert history[0]["namespace"] == "advice" and history[0]["from"] == 1.0 and history[0]["to"] < 1.0
    live.close(compact=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        report = current_pipeline(folder).learning_report()  # what `toolscout learning report DIR` reads
        again = DirectoryStorage.open(folder)
    assert "learning in namespace" not in caplog.text
    try:
        for replayed in (report["weight_history"], again.scout.learning_report()["weight_history"]):
            assert [(h["namespace"], h["from"], h["to"], h["why"]) for h in replayed] == \
                [(h["namespace"], h["from"], h["to"], h["why"]) for h in history]
            assert all(abs(r["time"] - h["time"]) < 1.0 for r, h in zip(replayed, history))
        text = render_report(report)
        last = history[-1]
        assert "automatic weight changes" in text
        assert f"namespace 'advice' {last['from']:.2f} -> {last['to']:.2f} ({last['why']})" in text
    finally:
        again.close()
    assert ToolScout.load(folder).learning_report()["weight_history"] == again.scout.learning_report()["weight_history"]

"""The service core: journal, replay, compaction, permissions, concurrency; and the pipeline's search
policies the servers rely on (name matches, always_include, abstention threshold)."""

import json
import threading

import pytest

from toolscout import Tool, ToolScout
from toolscout.serve import Principal, ServiceError, ToolService
from toolscout.serve.journal import JOURNAL, Journal, JournalError, encode_record


def make_dir(tmp_path, tools, retriever="bm25"):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever=retriever).save(folder)
    return folder


def state(service):
    return {t.id: t for t in service.storage.scout.tools}


def new_tool(i, ns="extra", text="Translate text between languages"):
    return Tool(f"{ns}.t{i}", f"t{i}", f"{text} (variant {i})", namespace=ns)


# ----------------------------------------------------------------------------- journal, replay

def test_writes_survive_a_restart_without_compaction(tmp_path, tools):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    r1 = svc.upsert([new_tool(1), tools[0].with_changes(description="Play music from a playlist")])
    r2 = svc.delete(["mail.send"])
    assert (r1.created, r1.updated, r2.deleted) == (["extra.t1"], ["weather.get_forecast"], ["mail.send"])
    assert (r1.seq, r2.seq) == (1, 2)
    expected = state(svc)
    svc.close(compact=False)  # as if killed: the snapshot is the old one, the journal holds both writes
    again = ToolService.open(folder)
    assert state(again) == expected and again.version() == 2
    assert again.search("play some music", k=1)[0].tool.id == "weather.get_forecast"
    assert "mail.send" not in again.storage.scout
    again.close()


def test_unchanged_upsert_is_not_journalled(tmp_path, tools):
    svc = ToolService.open(make_dir(tmp_path, tools))
    result = svc.upsert([tools[0], tools[1]])
    assert result.unchanged == [tools[0].id, tools[1].id] and result.seq == 0 and svc.storage.journal.records == 0
    svc.close()


def test_compaction_writes_a_snapshot_and_empties_the_journal(tmp_path, tools):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder, compact_every=6)  # journal items: each write counts one, and its tool one
    for i in range(3):
        svc.upsert([new_tool(i)])
    svc.storage._compactor.join()  # the third write (its sixth item) started a background compaction
    assert svc.storage.compactions == 1 and svc.storage.journal.records == 0
    svc.upsert([new_tool(9)])
    expected = state(svc)
    svc.close()  # compacts the last write too
    loaded = ToolScout.load(folder)
    assert {t.id: t for t in loaded.tools} == expected and loaded.saved_config["journal_seq"] == 4
    again = ToolService.open(folder)
    assert again.version() == 4 and state(again) == expected
    again.close()


def test_a_snapshot_the_disk_cannot_hold_is_a_503_naming_why_and_loses_no_write(tmp_path, tools):
    """A full disk during a compaction was a bare 500 (and a traceback at shutdown) while /health said ok:
    it is a 503 saying why, /health shows it, writes go on into the journal, and closing keeps them."""
    import errno

    from starlette.testclient import TestClient

    from toolscout.serve.http import create_app

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    scout = svc.storage.scout
    save = scout.save

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def body(tool):
        return {"name": tool.name, "namespace": tool.namespace, "description": tool.description}

    with TestClient(create_app(svc, close_service=False)) as client:
        assert client.put("/tools/extra.t1", json=body(new_tool(1))).status_code == 200
        scout.save = full_disk
        answer = client.post("/admin/compact")
        assert answer.status_code == 503, answer.text
        assert "No space left on device" in answer.json()["error"]["message"]
        assert client.get("/health").json()["snapshots"].startswith("failed: could not save a snapshot")
        assert client.put("/tools/extra.t2", json=body(new_tool(2))).status_code == 200
        expected = state(svc)
        svc.close()  # its snapshot fails too: logged, and the journal is closed with every write
        assert svc.storage.journal.records == 2
    scout.save = save
    again = ToolService.open(folder)  # replays the two writes, then saves the snapshot that failed (in the background)
    assert state(again) == expected
    again.close()  # waits for that snapshot
    assert again.storage.compactions == 1 and again.storage.snapshot_failed is None
    assert again.storage.journal.records == 0


def test_a_directory_whose_lock_cannot_be_written_is_refused_saying_what_reads_it(tmp_path, tools):
    from toolscout.serve.directory import LOCK_FILE

    folder = make_dir(tmp_path, tools)
    (folder / LOCK_FILE).mkdir()  # not a file this process can open for writing (as a read-only disk is)
    with pytest.raises(ServiceError, match=r"cannot open serve.lock for writing \(Is a directory\).*only reads"):
        ToolService.open(folder)


def test_crash_between_snapshot_and_journal_reset_replays_nothing_twice(tmp_path, tools):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    svc.upsert([new_tool(1)])
    svc.delete(["extra.t1"])
    svc.upsert([new_tool(2)])
    expected = state(svc)
    # the snapshot is committed but the process dies before the journal is reset
    svc.storage.scout.save(folder, extra_config={"journal_seq": svc.version()}, held_lock=svc.storage._lock_fd)
    svc.close(compact=False)
    again = ToolService.open(folder)
    assert state(again) == expected and again.version() == 3
    again.close()


def test_torn_last_record_is_dropped_and_a_damaged_middle_record_stops_the_start(tmp_path, tools):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    svc.upsert([new_tool(1)])
    svc.close(compact=False)
    journal = folder / JOURNAL
    good = journal.read_bytes()
    half = encode_record({"seq": 2, "op": "delete", "ids": ["extra.t1"]})[:-7]
    journal.write_bytes(good + half)  # a write that was in flight when the process died
    assert [r["op"] for r in Journal(folder).replay()] == ["upsert"] and journal.read_bytes() == good  # cut off
    journal.write_bytes(good + half)
    svc = ToolService.open(folder)  # replays, cutting the torn tail, then saves a snapshot of what it replayed
    assert "extra.t1" in svc.storage.scout and svc.version() == 1
    svc.close(compact=False)  # waits for that snapshot
    assert [r["op"] for r in Journal(folder).read()] == ["base"]
    svc = ToolService.open(folder)
    svc.upsert([new_tool(2)])
    svc.close(compact=False)
    damaged = bytearray(journal.read_bytes())
    damaged[12] ^= 0x20  # flip a bit inside the first record: its CRC no longer matches
    journal.write_bytes(bytes(damaged))
    with pytest.raises(JournalError, match=r"journal.log:1: damaged"):
        ToolService.open(folder)


def test_journal_record_framing():
    line = encode_record({"seq": 1, "op": "upsert", "tools": [{"id": "a", "name": "x\ny"}]})
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line[8:9] == b" "


def test_a_failed_apply_is_aborted_in_the_journal(tmp_path, tools, monkeypatch):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)

    def broken(_tools, **_when):
        raise RuntimeError("encoder crashed")

    monkeypatch.setattr(svc.storage.scout, "add", broken)
    with pytest.raises(RuntimeError):
        svc.upsert([new_tool(1)])
    monkeypatch.undo()
    svc.upsert([new_tool(2)])  # the failed write's number is not reused
    assert svc.version() == 2
    svc.close(compact=False)
    again = ToolService.open(folder)
    assert "extra.t1" not in again.storage.scout and "extra.t2" in again.storage.scout
    again.close()


def test_replacing_a_directory_counts_only_the_unsaved_writes_a_replay_would_apply(tmp_path, tools, monkeypatch,
                                                                                    caplog):
    """`index --out` over a directory warns of the catalog writes its journal held beyond the snapshot. A write
    whose apply failed (aborted in the journal) was never acknowledged and a replay skips it: it is not one of
    them (it was counted, with its abort record too)."""
    from toolscout.serve.held import replacing

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    monkeypatch.setattr(svc.storage.scout, "add", lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("crashed")))
    with pytest.raises(RuntimeError):
        svc.upsert([new_tool(1)])
    monkeypatch.undo()
    svc.upsert([new_tool(2)])
    svc.close(compact=False)  # as if killed: the journal holds the aborted write, its abort and one real write
    with caplog.at_level("WARNING", logger="toolscout"), replacing(folder) as replacement:
        replacement.saved()
    assert replacement.pending == 1
    assert "its journal held 1 catalog writes made since its last snapshot" in caplog.text


def test_learned_of_counts_what_feedback_taught_each_tool_as_its_summary_does(tmp_path, tools):
    svc = ToolService.open(make_dir(tmp_path, tools))
    svc.feedback([{"query": "send an email to my boss", "tool_ids": ["mail.send"]},
                  {"query": "mail the team the notes", "tool_ids": ["mail.send"], "source": "other"},
                  {"query": "email the landlord", "tool_ids": ["mail.send"], "outcome": "failure"},
                  {"query": "tomorrow's weather in Oslo", "tool_ids": ["weather.get_forecast"]}])
    assert svc.learned_of(["mail.send", "weather.get_forecast", "files.read", "no.such_tool"]) == {
        "mail.send": 2, "weather.get_forecast": 1, "files.read": 0, "no.such_tool": 0}
    assert svc.feedback_of("mail.send")["learned"] == 2  # the per-tool summary agrees
    svc.close()


def test_one_server_per_directory(tmp_path, tools):
    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    with pytest.raises(ServiceError, match="another toolscout server"):
        ToolService.open(folder)
    svc.close()
    ToolService.open(folder).close()
    with pytest.raises(ServiceError, match="not a pipeline directory"):
        ToolService.open(tmp_path)


def test_saving_from_python_over_a_served_directory_is_refused_and_the_servers_writes_kept(tmp_path, tools):
    """`ToolScout.save` over a directory a server held went through, and the server's next snapshot silently
    replaced it. A save is refused while a server holds the directory's lock; the server's own snapshot,
    which holds it, goes through; once it stops, a save goes through again."""
    from toolscout.artifacts import SaveRefused

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    svc.upsert([new_tool(1)])
    mine = ToolScout.load(folder)
    mine.add([new_tool(2)])
    with pytest.raises(SaveRefused, match=r"a toolscout server is serving this directory \(a live process holds "
                                          r".*serve.lock\).*Write through the server's HTTP API.*or stop the server"):
        mine.save(folder)
    assert svc.compact()  # the server's own snapshot
    svc.close()
    assert "extra.t1" in ToolScout.load(folder)
    mine.save(folder, overwrite=True)  # the server is gone (its lock file stays, unheld)
    assert "extra.t2" in ToolScout.load(folder) and (folder / "serve.lock").exists()


def test_index_refuses_a_directory_a_server_serves_and_replaces_the_old_journal_with_the_catalog(tmp_path, tools,
                                                                                                   capsys):
    from toolscout.cli import main

    folder = make_dir(tmp_path, tools)
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps([{"name": f"t{i}", "description": f"Translate text, variant {i}"} for i in range(3)]))
    index = ["index", str(catalog), "--out", str(folder), "--retriever", "bm25"]
    svc = ToolService.open(folder)
    svc.upsert([new_tool(1)])
    capsys.readouterr()
    assert main(index) != 0 and "another toolscout server is serving this directory" in capsys.readouterr().err
    svc.close(compact=False)  # as if killed: the journal holds a write the snapshot lacks
    assert main(index) == 0
    again = ToolService.open(folder)
    assert sorted(state(again)) == ["t0", "t1", "t2"]  # the old catalog's journalled write is not replayed over it
    again.upsert([new_tool(2)])
    again.close(compact=False)
    reopened = ToolService.open(folder)
    assert sorted(state(reopened)) == ["extra.t2", "t0", "t1", "t2"]  # and the new journal goes on from there
    reopened.close()


def test_index_over_a_served_directory_keeps_the_feedback_only_its_journal_holds(tmp_path, tools, capsys):
    """A server killed after acknowledging feedback (journalled, no snapshot since): `index --out` over the
    directory takes that feedback over too, for the tools the new catalog has."""
    from toolscout.cli import main

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    kept, gone = tools[0].id, tools[1].id
    svc.feedback([{"query": f"request number {i}", "tool_ids": [kept]} for i in range(3)]
                 + [{"query": "another request", "tool_ids": [gone]}])
    svc.close(compact=False)  # as if killed: the journal holds feedback the snapshot lacks
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text("".join(json.dumps(t.to_record()) + "\n" for t in tools if t.id != gone))
    capsys.readouterr()
    assert main(["index", str(catalog), "--out", str(folder), "--retriever", "bm25"]) == 0
    assert f"kept what {folder} learned from feedback: 3 (tool, request) pairs; dropped 1" in capsys.readouterr().err
    assert ToolScout.load(folder).ledger.summary(kept)["learned"] == 3


def test_cli_search_sees_the_writes_a_running_server_journalled_and_leaves_its_journal_alone(tmp_path, tools, capsys):
    from toolscout.cli import main

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    svc.upsert([Tool("zoo.feed", "feed_zebras", "Feed the zebras at the zoo")])
    with open(folder / JOURNAL, "ab") as fh:  # a write in flight: a torn last line the server has not finished
        fh.write(encode_record({"seq": 2, "op": "delete", "ids": ["zoo.feed"]})[:20])
    size = (folder / JOURNAL).stat().st_size
    capsys.readouterr()
    assert main(["search", str(folder), "feed the zebras", "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "zoo.feed"
    assert (folder / JOURNAL).stat().st_size == size  # a reader cuts nothing off the server's journal
    svc.close(compact=False)


def test_a_reader_beside_a_server_reads_again_when_a_compaction_moves_under_it(tmp_path, tools, monkeypatch):
    from toolscout.serve import held

    folder = make_dir(tmp_path, tools)
    svc = ToolService.open(folder)
    svc.upsert([Tool("zoo.feed", "feed_zebras", "Feed the zebras at the zoo")])
    load = ToolScout.load
    compacted = []

    def load_then_compact(*args, **kwargs):  # the server compacts between the reader's snapshot and journal
        scout = load(*args, **kwargs)
        if not compacted:
            svc.storage.compact()
            compacted.append(True)
        return scout

    monkeypatch.setattr(held.ToolScout, "load", load_then_compact)
    assert "zoo.feed" in held.current_pipeline(folder)  # the old snapshot and the new journal lack it
    assert compacted
    svc.close()


# ------------------------------------------------------------------------------ permissions

def test_a_restricted_principal_sees_and_writes_only_its_namespaces(tmp_path, tools):
    svc = ToolService.open(make_dir(tmp_path, tools))
    mail = Principal("mail-team", frozenset({"mail"}), write=True)
    reader = Principal("reader", frozenset({"mail"}), write=False)
    hits = svc.search("book a flight and send an email", k=12, principal=mail)
    assert hits and {h.tool.namespace for h in hits} == {"mail"}
    # asking for another namespace does not widen the restriction
    assert svc.search("book a flight", k=5, principal=mail, namespaces=["travel"]) == []
    assert svc.search("book_flight", k=5, principal=mail) == []  # name matches obey it too
    assert svc.search("send email", k=5, principal=mail, always_include=["flights.book"])[-1].tool.namespace == "mail"
    with pytest.raises(KeyError):
        svc.get("flights.book", mail)
    assert svc.list(mail)[0] == 2 and svc.namespaces(mail) == {"mail": 2}
    with pytest.raises(PermissionError):
        svc.upsert([new_tool(1, ns="travel")], mail)
    with pytest.raises(PermissionError):  # replacing another namespace's tool by id
        svc.upsert([tools[2].with_changes(namespace="mail")], mail)
    with pytest.raises(KeyError):
        svc.delete(["flights.book"], mail)
    with pytest.raises(PermissionError):
        svc.upsert([new_tool(1, ns="mail")], reader)
    assert svc.upsert([new_tool(1, ns="mail")], mail).created == ["mail.t1"]
    svc.close()


# --------------------------------------------------------------------------- search policies

def test_a_query_naming_a_tool_ranks_it_first(tools):
    scout = ToolScout.from_tools(tools, retriever="bm25")
    for query in ("getCurrentWeather", "get_current_weather", "get current weather", "weather.get_current",
                  "getCurentWeather"):  # exact forms and one typo
        hits = scout.search(query, k=3)
        assert hits[0].tool.id == "weather.get_current" and hits[0].match == "name", query
    assert scout.search("what is the temperature outside", k=1)[0].match == "retrieval"
    assert scout.search("get current weather", k=3, match_names=False)[0].match == "retrieval"


def test_same_name_on_two_servers_returns_both_first(tools):
    extra = [Tool("github.search", "search", "Search code in repositories.", namespace="github"),
             Tool("jira.search", "search", "Search issues in a tracker.", namespace="jira")]
    scout = ToolScout.from_tools(tools + extra, retriever="bm25")
    hits = scout.search("search", k=3)
    assert {h.tool.id for h in hits[:2]} == {"github.search", "jira.search"} and hits[0].match == "name"
    assert [h.tool.id for h in scout.search("jira.search", k=1)] == ["jira.search"]


def test_min_score_abstains_and_always_include_is_added(tools):
    scout = ToolScout.from_tools(tools, retriever="bm25")
    weak = scout.search("quantum chromodynamics lattice simulation", k=3)
    strong = scout.search("weather forecast for a city", k=3)
    assert strong[0].score > 1.0
    assert scout.search("weather forecast for a city", k=3, min_score=1.0) == strong
    assert scout.search("weather forecast for a city", k=3, min_score=strong[0].score + 0.01) == []
    assert weak == [] or weak[0].score < 1.0
    hits = scout.search("weather forecast for a city", k=2, always_include=["files.read", "nope"])
    assert [h.match for h in hits] == ["retrieval", "retrieval", "always"] and hits[-1].tool.id == "files.read"
    abstained = scout.search("weather forecast", k=2, min_score=99.0, always_include=["files.read"])
    assert [(h.tool.id, h.match) for h in abstained] == [("files.read", "always")]


# ----------------------------------------------------------------------------- concurrency

def test_each_search_sees_one_whole_catalog_state_while_writes_go_on(tmp_path, tools):
    """Readers search while a writer adds and removes tools. Oracle: every answer (a batch of three
    queries, ids, scores and match kinds) equals the answer of a fresh index of one of the states the
    writer passed through, the same state for all three queries: never half of a write."""
    svc = ToolService.open(make_dir(tmp_path, tools), fsync=False)
    queries = ["weather in Oslo", "send an email", "translate text"]
    answers, errors = [], []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                answers.append([[(h.tool.id, h.score, h.match) for h in hits] for hits in svc.search(queries, k=5)])
            except Exception as exc:  # pragma: no cover - a failure is reported below
                errors.append(exc)

    catalog = {t.id: t for t in tools}
    states = [list(catalog.values())]
    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(25):
        svc.upsert([new_tool(i)])
        catalog[f"extra.t{i}"] = new_tool(i)
        states.append(list(catalog.values()))
        if i % 2:
            svc.delete([f"extra.t{i - 1}"])
            del catalog[f"extra.t{i - 1}"]
            states.append(list(catalog.values()))
    stop.set()
    for t in threads:
        t.join()
    svc.close()
    assert not errors and answers
    expected = [[[(h.tool.id, h.score, h.match) for h in hits]
                 for hits in ToolScout.from_tools(state, retriever="bm25").search(queries, k=5)] for state in states]
    for answer in answers:
        assert any(_same_hits(answer, candidate) for candidate in expected), answer
    assert sorted(t.id for t in states[-1] if t.namespace == "extra") == sorted(
        [f"extra.t{i}" for i in range(25) if i % 2 or i == 24])


def _same_hits(got, want) -> bool:
    return all([(i, m) for i, _s, m in g] == [(i, m) for i, _s, m in w]
               and all(abs(a[1] - b[1]) < 1e-5 for a, b in zip(g, w)) for g, w in zip(got, want))


def test_queries_queued_during_a_batch_form_the_next_batch_and_cancelled_ones_are_dropped():
    from toolscout.serve.service import SearchBatcher

    calls, first_started, release = [], threading.Event(), threading.Event()

    def search_many(options, queries):
        calls.append((options, list(queries)))
        first_started.set()
        release.wait(10)
        return [[f"{options}:{q}"] for q in queries]

    batcher = SearchBatcher(search_many)
    first = batcher.submit_future(5, "q0")
    assert first_started.wait(10)  # the worker is busy with q0: the next queries queue up
    queued = [batcher.submit_future(5 if i != 2 else 10, f"q{i}") for i in range(1, 5)]
    dropped = batcher.submit_future(5, "gone")
    assert dropped.cancel()
    release.set()
    assert first.result(10) == ["5:q0"]
    assert [f.result(10) for f in queued] == [["5:q1"], ["10:q2"], ["5:q3"], ["5:q4"]]
    assert calls == [(5, ["q0"]), (5, ["q1", "q3", "q4"]), (10, ["q2"])]  # one call per options, "gone" skipped
    batcher.close()


def test_search_future_answers_like_search(tmp_path, tools):
    svc = ToolService.open(make_dir(tmp_path, tools), fsync=False)
    want = [(h.tool.id, h.score, h.match) for h in svc.search("weather in Oslo", k=3)]
    future = svc.search_future("weather in Oslo", k=3)
    assert [(h.tool.id, h.score, h.match) for h in future.result(10)] == want
    with pytest.raises(ValueError):
        svc.search_future("   ")
    svc.close()
    assert svc.search_future("weather in Oslo") is None  # closed: the caller falls back to search()


def test_journal_append_and_replay_roundtrip(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"seq": 1, "op": "delete", "ids": ["a"]})
    journal.reset(1)
    journal.append({"seq": 2, "op": "delete", "ids": ["b"]})
    journal.close()
    records = list(Journal(tmp_path).replay())
    assert [(r["seq"], r["op"]) for r in records] == [(1, "base"), (2, "delete")]


def test_answers_are_cached_per_catalog_version_and_never_served_after_a_write(tmp_path, tools):
    svc = ToolService.open(make_dir(tmp_path, tools), fsync=False)
    first = svc.search("translate text between languages", k=3)
    again = svc.search("translate text between languages", k=3)
    assert again == first and svc.answers.hits == 1  # the second came from the cache
    svc.upsert([new_tool(1)])  # a tool that fits the task: written, then searched at once
    after = svc.search("translate text between languages", k=3)
    assert after[0].tool.id == "extra.t1" and after != first
    misses = svc.answers.misses
    svc.feedback([{"query": "translate text between languages", "tool_ids": ["files.read"]}])
    svc.search("translate text between languages", k=3)  # feedback is a new version too: answered afresh
    assert svc.answers.hits == 1 and svc.answers.misses == misses + 1
    svc.close()

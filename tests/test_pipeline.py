import json
import os
import shutil
import random
import signal
import subprocess
import sys
import textwrap
import threading
from types import MappingProxyType

import pytest

from toolscout import ToolScout
from toolscout.artifacts import ArtifactError, read_config, write_artifact
from toolscout.tool import Tool

QUERIES = ["book a flight to Paris", "weather tomorrow in Oslo", "email my boss", "stock price of ACME"]


def snapshot(scout, k=5):
    return [[(h.tool.id, h.score) for h in hits] for hits in scout.search(QUERIES, k=k)]


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("retriever", ["bm25", "dense"])
def test_saved_pipeline_loads_in_a_new_process_with_identical_results(tools, tmp_path, retriever):
    scout = ToolScout.from_tools(tools, retriever=retriever)
    scout.save(tmp_path / "idx")
    script = textwrap.dedent(f"""
        import json, sys
        from toolscout import ToolScout
        scout = ToolScout.load(sys.argv[1])
        out = [[(h.tool.id, h.score) for h in hits] for hits in scout.search({QUERIES!r}, k=5)]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "idx")], capture_output=True, text=True,
                          check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    other = [[(tid, score) for tid, score in row] for row in json.loads(proc.stdout.strip().splitlines()[-1])]
    assert other == snapshot(scout)  # same ids, same order, bit-identical scores
    loaded = ToolScout.load(tmp_path / "idx")
    assert loaded.tools == scout.tools


def test_hits_carry_tools_and_respect_namespaces(tools):
    scout = ToolScout.from_tools(tools, retriever="bm25")
    hits = scout.search("book a flight", k=2)
    assert [h.rank for h in hits] == [1, 2] and hits[0].tool.id == "flights.book"
    assert hits[0].score >= hits[1].score
    assert all(h.tool.namespace == "mail" for h in scout.search("book a flight send", k=5, namespaces=["mail"]))
    d = hits[0].to_dict()
    assert d["id"] == "flights.book" and d["namespace"] == "travel" and "method" not in d


def test_a_filter_given_a_lone_string_or_a_dict_is_refused_by_name(tools):
    """Filter(namespaces="mail") matched the namespaces that are characters of "mail" ("a"), not "mail";
    Filter(ids="a.x") matched nothing; filter={...} crashed with AttributeError deep in the ranking."""
    from toolscout import Filter
    from toolscout.errors import InvalidRequest

    scout = ToolScout.from_tools(tools, retriever="bm25")
    for make, says in ((lambda: Filter(namespaces="mail"), r"^Filter namespaces: give a list \(\['mail'\]\)$"),
                       (lambda: Filter(ids="mail.send"), r"^Filter ids: give a list \(\['mail.send'\]\)$"),
                       (lambda: Filter(exclude_ids="mail.send"), r"^Filter exclude_ids: give a list")):
        with pytest.raises(InvalidRequest, match=says):
            make()
    with pytest.raises(InvalidRequest, match=r"^filter: give a toolscout.Filter .*not dict$"):
        scout.search("send an email", filter={"namespaces": ["mail"]})
    in_mail = {h.tool.id for h in scout.search("send an email", k=50, filter=Filter(namespaces=["mail"]))}
    assert in_mail and in_mail == {t.id for t in tools if t.namespace == "mail"} & in_mail
    assert [h.tool.id for h in scout.search("send an email", filter=Filter(ids=["mail.send"]))] == ["mail.send"]


def test_a_search_in_namespaces_or_with_always_include_ids_no_tool_has_warns_naming_them(tools):
    """MCP and the CLI said unknown_namespaces; in Python the search answered [] and ignored unknown
    always_include ids without a word."""
    import warnings

    from toolscout.hits import UnknownNamesWarning

    scout = ToolScout.from_tools(tools, retriever="bm25")
    with pytest.warns(UnknownNamesWarning) as caught:
        assert scout.search("send an email", namespaces=["mail", "mial"], always_include=["mail.send", "nope"])
    assert [str(w.message) for w in caught] == [
        "namespaces ['mial'] hold no tool (a typo?): the search finds nothing there (ToolScout.unknown_namespaces "
        "says which, before a search)", "always_include: no tool has the id(s) ['nope']; ignored"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scout.search("send an email", namespaces=["mail"], always_include=["mail.send"])


def test_the_python_surface_lists_its_names_documents_remove_and_exports_every_error():
    """dir(toolscout) missed the lazily loaded names (tab completion, help()); remove() had no docstring;
    ArtifactError and DamagedFile lived only in toolscout.artifacts."""
    import toolscout
    import toolscout.artifacts
    import toolscout.errors

    assert set(toolscout.__all__) <= set(dir(toolscout))
    assert ToolScout.remove.__doc__ and "NotFound" in ToolScout.remove.__doc__
    assert toolscout.errors.ArtifactError is toolscout.artifacts.ArtifactError
    assert issubclass(toolscout.errors.DamagedFile, toolscout.errors.ArtifactError)
    assert issubclass(toolscout.errors.ArtifactError, toolscout.errors.ToolScoutError)


def test_add_update_remove(tools):
    scout = ToolScout.from_tools(tools[:10], retriever="bm25")
    scout.add([tools[10], tools[0].with_changes(description="Play music from a playlist")])
    assert len(scout) == 11
    assert scout.get("weather.get_forecast").description.startswith("Play music")
    assert scout.search("play some music", k=1)[0].tool.id == "weather.get_forecast"
    scout.remove(["weather.get_forecast"])
    assert "weather.get_forecast" not in scout
    with pytest.raises(KeyError, match="unknown tool id"):
        scout.remove(["nope"])
    with pytest.raises(ValueError, match="duplicate tool id"):
        scout.add([tools[1], tools[1]])
    with pytest.raises(ValueError, match="with something visible in it"):
        scout.search("   ")
    with pytest.raises(KeyError, match="no tool with id 'weather.get_forecast'"):
        scout.get("weather.get_forecast")
    assert scout.get("weather.get_forecast", None) is None and scout.get(tools[1].id, None) == tools[1]
    with pytest.deprecated_call():
        assert scout.find(tools[1].id) == tools[1]


def test_a_commit_never_removes_a_newer_version_another_writer_is_still_writing(tmp_path):
    """Two writers of one folder: the first to finish swept every version but its own, including the folder
    the other was still writing into, whose commit then pointed at nothing or failed. Now a commit removes only
    the versions older than its own, under the write lock; the newer writer's save then succeeds."""
    root, config = tmp_path / "a", {"kind": "x", "format_version": 1}
    with write_artifact(root, config) as folder:
        (folder / "data.txt").write_text("zero")
    first, second = write_artifact(root, config), write_artifact(root, config)
    older = first.__enter__()
    newer = second.__enter__()  # staged after the first: a higher version number
    (older / "data.txt").write_text("first")
    first.__exit__(None, None, None)  # the first writer commits while the second is mid-write
    assert newer.is_dir()
    (newer / "data.txt").write_text("second")
    second.__exit__(None, None, None)
    folder, _ = read_config(root, kind="x", max_format=1)
    assert folder.name == newer.name and (folder / "data.txt").read_text() == "second"
    assert not older.exists()  # the older version went with the newer commit


def test_a_commit_never_removes_an_older_version_another_writer_is_still_writing(tmp_path):
    """The mirror case: the writer that staged first (the lower number) is still writing when the later one
    commits. That commit swept every older version, the first writer's folder with them, and the first
    writer's save then failed, or, had it finished writing, pointed CURRENT at a removed folder. A version a
    writer still holds is left alone; the first writer then commits (its save is the later one)."""
    root, config = tmp_path / "a", {"kind": "x", "format_version": 1}
    with write_artifact(root, config) as folder:
        (folder / "data.txt").write_text("zero")
    first, second = write_artifact(root, config), write_artifact(root, config)
    older = first.__enter__()
    newer = second.__enter__()
    (newer / "data.txt").write_text("second")
    second.__exit__(None, None, None)  # the later writer commits while the first is mid-write
    assert older.is_dir()
    (older / "data.txt").write_text("first")
    first.__exit__(None, None, None)
    folder, _ = read_config(root, kind="x", max_format=1)
    assert folder.name == older.name and (folder / "data.txt").read_text() == "first"
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", "claim.lock", older.name, "write.lock"]


_MANY_SAVERS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from toolscout.artifacts import write_artifact
    for i in range(int(sys.argv[2])):
        with write_artifact(Path(sys.argv[1]), {"kind": "x", "format_version": 1}) as folder:
            (folder / "who").write_text(f"{sys.argv[3]}-{i}")
""")


def test_processes_saving_at_once_never_fail_or_leave_the_pointer_dangling(tmp_path):
    """Each writer numbered its version as one more than the folders it saw, then created it: two processes
    could pick the same number (FileExistsError), and a commit swept a folder another was still writing. Four
    processes saving 15 times each, at once: every save succeeds, and the live version is whole."""
    root = tmp_path / "idx"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    savers = [subprocess.Popen([sys.executable, "-c", _MANY_SAVERS, str(root), "15", str(n)], env=env,
                               stderr=subprocess.PIPE, text=True) for n in range(4)]
    errors = [s.communicate(timeout=120)[1] for s in savers]
    assert [s.returncode for s in savers] == [0] * 4, "\n".join(errors)
    folder, _ = read_config(root, kind="x", max_format=1)
    assert (folder / "who").read_text().endswith("-14")  # the last save of one of them
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", "claim.lock", folder.name, "write.lock"]


def test_a_save_reads_the_live_version_again_when_another_writer_replaced_it_meanwhile(tmp_path, monkeypatch):
    """A save checks what the live version holds. Another writer's commit could replace and remove that version
    between reading CURRENT and reading its config: the save was refused as "its live version cannot be read"
    (seen in the four-savers test above under load). It reads the new live version instead; a live version that
    cannot be read while it stays live is still refused."""
    import toolscout.artifacts as artifacts

    root, config = tmp_path / "idx", {"kind": "x", "format_version": 1}
    for n in range(2):
        with write_artifact(root, config) as folder:
            (folder / "n").write_text(str(n))
    read_json, replaced = artifacts.read_json, []

    def read_as_another_writer_commits(path):
        if not replaced:  # the version being read is replaced by a new one and removed, as a commit does
            replaced.append(path.parent)
            newer = root / "v000009"
            shutil.copytree(path.parent, newer)
            (root / "CURRENT").write_text(newer.name)
            shutil.rmtree(path.parent)
        return read_json(path)

    monkeypatch.setattr(artifacts, "read_json", read_as_another_writer_commits)
    with write_artifact(root, config) as folder:
        (folder / "n").write_text("2")
    assert replaced and (artifacts.current_version(root) / "n").read_text() == "2"
    monkeypatch.undo()
    (artifacts.current_version(root) / "config.json").unlink()  # damaged and still live
    with pytest.raises(ArtifactError, match="its live version cannot be read"):
        with write_artifact(root, config):
            pass


def test_a_first_save_killed_before_its_commit_does_not_block_the_next_save(tmp_path):
    """A first save killed before its commit (SIGKILL: no cleanup ran) leaves a version folder and no CURRENT.
    That directory was refused as "not a toolscout artefact", so the user could not save there again; now it
    is recognised as a first save's leftovers, the next save commits, and the leftovers go."""
    root, config = tmp_path / "idx", {"kind": "x", "format_version": 1}
    (root / "v000001").mkdir(parents=True)
    (root / "v000001" / "half.npy").write_bytes(b"\x93NUMPY")
    (root / "write.lock").touch()
    with write_artifact(root, config) as folder:
        (folder / "data.txt").write_text("whole")
    folder, _ = read_config(root, kind="x", max_format=1)
    assert (folder / "data.txt").read_text() == "whole"
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", "claim.lock", folder.name, "write.lock"]
    (root / "CURRENT").unlink()
    (root / "notes.txt").write_text("mine")  # a user's own file: still not ours to write into
    with pytest.raises(ArtifactError, match="not a toolscout artefact"):
        with write_artifact(root, config):
            pass


def test_artifact_write_is_atomic_and_checks_kind(tmp_path):
    root = tmp_path / "a"
    with write_artifact(root, {"kind": "x", "format_version": 1}) as folder:
        (folder / "data.txt").write_text("one")
    with pytest.raises(RuntimeError):
        with write_artifact(root, {"kind": "x", "format_version": 1}) as folder:
            (folder / "data.txt").write_text("half")
            raise RuntimeError("crash while writing")
    folder, config = read_config(root, kind="x", max_format=1)
    assert (folder / "data.txt").read_text() == "one" and config["kind"] == "x"
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", "claim.lock", folder.name, "write.lock"]
    with pytest.raises(ArtifactError, match="expected 'y'"):
        read_config(root, kind="y", max_format=1)
    with pytest.raises(ArtifactError, match="format_version 2"):
        with write_artifact(root, {"kind": "x", "format_version": 2}):
            pass
        read_config(root, kind="x", max_format=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="refusing"):
        with write_artifact(tmp_path / "other", {"kind": "x", "format_version": 1}):
            pass
    assert (tmp_path / "other" / "precious.txt").read_text() == "keep me"



def test_saving_an_index_over_a_trained_model_is_refused_and_the_model_kept(tools, tmp_path):
    """ToolScout.save (and so `index --out`, `demo --out`) into a `toolscout train` output would replace the
    model with an index: refused, naming the folder and what it holds, and every file of the model kept."""
    from toolscout.models import model_base, model_config

    model = tmp_path / "t2v"
    with write_artifact(model, model_base("tool2vec")) as folder:
        (folder / "usage.npz").write_bytes(b"trained weights")
    before = sorted(str(p.relative_to(model)) for p in model.rglob("*"))
    with pytest.raises(ArtifactError, match=rf"{model}: holds a trained 'tool2vec' model; writing an index"):
        ToolScout.from_tools(tools, retriever="bm25").save(model)
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*")) == before
    folder, config = model_config(model, method="tool2vec")
    assert (folder / "usage.npz").read_bytes() == b"trained weights"
    (folder / "config.json").write_text("{torn")  # what a damaged folder holds is unknown: not written over
    with pytest.raises(ArtifactError, match=rf"{model}: its live version cannot be read .* what it holds is unknown"):
        ToolScout.from_tools(tools, retriever="bm25").save(model)
    assert (folder / "usage.npz").read_bytes() == b"trained weights"

KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    from toolscout import ToolScout, Tool
    from toolscout.retrievers.bm25 import BM25Retriever
    scout = ToolScout.load(sys.argv[1])
    scout.add([Tool(f"new{i}", f"new_tool_{i}", "brand new tool about flights") for i in range(50)])
    original = BM25Retriever.save
    def slow_save(self, folder):
        original(self, folder)
        print("HALFWAY", flush=True)
        time.sleep(60)
    BM25Retriever.save = slow_save
    scout.save(sys.argv[1])
""")


def test_killing_the_process_mid_save_leaves_the_previous_index_loadable(tools, tmp_path):
    root = tmp_path / "idx"
    scout = ToolScout.from_tools(tools, retriever="bm25")
    scout.save(root)
    before = snapshot(scout)
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "HALFWAY"  # the new version is half written
        assert len([p for p in root.iterdir() if p.name.startswith("v")]) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    loaded = ToolScout.load(root)
    assert len(loaded) == len(tools) and snapshot(loaded) == before
    loaded.add([Tool("later", "later_tool", "added after the crash")])
    loaded.save(root)  # the next save succeeds and sweeps the half-written version away
    assert len(ToolScout.load(root)) == len(tools) + 1
    assert len([p for p in root.iterdir() if p.name.startswith("v")]) == 1


@pytest.mark.slow  # starts and kills processes
def test_kill_at_random_moments_always_leaves_a_whole_index(tools, tmp_path):
    """A child adds a tool and saves, over and over, saying when each save is done. It is killed at once
    after a random number of saves, so the kill lands somewhere inside the next one (which save, and
    where in it, varies). Oracle: the index loads whole and holds at least every save the child finished."""
    root = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(root)
    script = textwrap.dedent("""
        import sys
        from toolscout import ToolScout, Tool
        scout = ToolScout.load(sys.argv[1])
        for round in range(1000):
            scout.add([Tool(f"r{round}", f"round_{round}", "x")])
            scout.save(sys.argv[1])
            print(f"SAVED {round}", flush=True)
    """)
    done = -1
    rng = random.Random(7)
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True)
        try:
            for _saved in range(rng.randint(1, 4)):
                line = proc.stdout.readline()
                assert line.startswith("SAVED "), line
                done = max(done, int(line.split()[1]))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        loaded = ToolScout.load(root)  # never a half-written index
        assert len(loaded.retriever) == len(loaded)
        assert {f"r{i}" for i in range(done + 1)} <= {t.id for t in loaded.tools}


def test_misuse_of_the_python_api_is_refused_naming_the_argument_and_changes_nothing(tools):
    from toolscout.errors import InvalidRequest

    scout = ToolScout.from_tools(tools, retriever="bm25")
    before = [h.tool.id for h in scout.search("send an email", k=20)]
    with pytest.raises(InvalidRequest, match="tool 'zz.zebra': title must be a string, got int"):
        # refused as it is made: no index takes half of a batch (BM25 took it and the dense store did not)
        scout.add([Tool("zz.ok", "ok", "Fine"), Tool("zz.zebra", "zebra", "Feed the zebras", title=5)])
    with pytest.raises(InvalidRequest, match="tags must be a list of strings"):
        Tool("zz.tags", "tags", tags="abc")  # not ('a', 'b', 'c')
    for call, says in ((lambda: scout.search(123), r"^query: give a task \(str\) or a list of tasks, not int$"),
                       (lambda: scout.search(None), r"^query: give a task \(str\) or a list of tasks, not NoneType$"),
                       (lambda: scout.search("read \ud800 files"),  # a TypeError from the tokenizer
                        r"^query 'read \\ud800 files': a lone surrogate \(\\ud800 to \\udfff\) is not a Unicode "),
                       (lambda: scout.search(b"send an email"), r"^query: give a task \(str\) or a list of tasks, "
                                                                r"not bytes \(decode bytes to text first\)$"),
                       (lambda: scout.search("x", namespaces="mail"), r"namespaces: give a list \(\['mail'\]\)"),
                       (lambda: scout.search("x", always_include="mail.send"), "always_include: give a list"),
                       (lambda: scout.remove("mail.send"), r"ids: give a list \(\['mail.send'\]\)"),
                       (lambda: scout.remove(bytearray(b"mail.send")), r"^ids: give a list, not bytearray \(decode "),
                       (lambda: scout.search("x", namespaces=MappingProxyType({"mail": 1})),
                        r"^namespaces: give a list, not mappingproxy$"),
                       (lambda: scout.add(tools[0]), "tools: give a list"),
                       (lambda: scout.set_learning(weights={"mail": float("nan")}), "must be between 0 and 1"),
                       (lambda: scout.set_learning(weights={"mail": -5}), "must be between 0 and 1"),
                       (lambda: scout.set_learning(freeze="yes"), "learning freeze: true or false"),
                       # one event where a list of them goes: it said "each event must be an object", which it is
                       (lambda: scout.learn({"query": "email", "tool_ids": ["mail.send"]}),
                        r"^learn: give a list of events, not dict$"),
                       # NaN compares false with every score (no threshold at all); True was taken as k=1
                       (lambda: scout.search("x", min_score=float("nan")), r"^min_score must be a number \(not NaN\), got nan$"),
                       (lambda: scout.search("x", min_score="0.5"), r"^min_score must be a number \(not NaN\), got '0.5'$"),
                       (lambda: scout.search("x", k=True), r"^k must be a whole number, got True$")):
        with pytest.raises(InvalidRequest, match=says):
            call()
    assert [h.tool.id for h in scout.search("send an email", k=20)] == before and "zz.zebra" not in scout


def _refusing(method, times):
    """`method`, refusing its first `times` calls (a component that fails part-way through a write)."""
    calls = []

    def refuse(*args):
        calls.append(args)
        if len(calls) <= times:
            raise RuntimeError("the encoder refused the batch")
        return method(*args)
    return refuse


def test_a_write_a_component_refuses_part_way_changes_nothing_and_save_refuses_a_scout_it_left_torn(tools, tmp_path):
    """One bad tool in `add()` made the hybrid's BM25 take the batch and its dense part fail: the catalog and
    the retriever disagreed, searches raised KeyError, and the next save retired the good index for one that
    could not be loaded. A write is all-or-nothing now, and a scout whose parts disagree is never saved."""
    from toolscout.errors import Conflict
    from toolscout.retrievers.hybrid import HybridRetriever

    scout = ToolScout(HybridRetriever(["bm25", "bm25"], weights=[1.0, 1.0]), tools)
    scout.save(tmp_path / "idx")
    before, second = snapshot(scout), scout.retriever.components[1]
    second.add = _refusing(second.add, 1)
    with pytest.raises(RuntimeError, match="refused"):
        scout.add([Tool("zz.new", "new", "Book a flight to Paris now"), tools[0].with_changes(description="Email")])
    second.remove = _refusing(second.remove, 1)
    with pytest.raises(RuntimeError, match="refused"):
        scout.remove([tools[1].id])
    assert snapshot(scout) == before and len(scout.retriever) == len(scout) == len(tools)
    assert [len(c) for c in scout.retriever.components] == [len(tools)] * 2
    scout.add([Tool("zz.later", "later", "A later tool")])  # writes work again, and the save loads
    scout.save(tmp_path / "idx")
    assert len(ToolScout.load(tmp_path / "idx")) == len(tools) + 1

    second.add = _refusing(second.add, 2)  # refuses the undo too: the scout knows it is torn
    with pytest.raises(RuntimeError, match="refused"):
        scout.add([tools[0].with_changes(description="Email")])
    with pytest.raises(Conflict, match=r"not saving to .*idx: this scout is inconsistent \(a failed write could "
                                       r"not be undone \(RuntimeError: the encoder refused the batch\)\)"):
        scout.save(tmp_path / "idx")
    torn = ToolScout(HybridRetriever(["bm25", "bm25"], weights=[1.0, 1.0]), tools)
    torn.retriever.components[0].add([Tool("zz.stray", "stray", "Not in the catalog")])
    with pytest.raises(Conflict, match=f"its retriever holds {len(tools) + 1} tools but its catalog {len(tools)}\\)"):
        torn.save(tmp_path / "idx")
    assert len(ToolScout.load(tmp_path / "idx")) == len(tools) + 1  # the good version is still there


def test_save_refuses_a_hybrid_whose_second_component_disagrees_with_the_catalog(tools, tmp_path):
    """The consistency check before a save read the hybrid's size, its first component's only: a stray tool
    in the second component went unseen and the save wrote an index that cannot be loaded (review #13).
    Every component is checked now."""
    from toolscout.errors import Conflict
    from toolscout.retrievers.hybrid import HybridRetriever

    torn = ToolScout(HybridRetriever(["bm25", "bm25"], weights=[1.0, 1.0]), tools)
    torn.retriever.components[1].add([Tool("zz.stray", "stray", "Not in the catalog")])
    with pytest.raises(Conflict, match=rf"its retriever's component 1 \(bm25\) holds {len(tools) + 1} tools but "
                                       rf"its catalog {len(tools)}\)"):
        torn.save(tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_a_stale_scout_saving_over_a_newer_save_is_refused_unless_told_to_overwrite(tools, tmp_path):
    """Two scouts loaded one index; one saved, then the other saved and silently discarded the first one's
    tools. A save now checks that the directory's live version is the one the scout loaded or last saved."""
    from toolscout.artifacts import SaveRefused

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    a, b = ToolScout.load(folder), ToolScout.load(folder)
    b.add([Tool("zz.b1", "b1", "Added by b")])
    b.save(folder)
    b.add([Tool("zz.b2", "b2", "Added by b again")])
    b.save(folder)  # its own last save is what it replaces: no refusal
    a.add([Tool("zz.a", "a", "Added by a")])
    with pytest.raises(SaveRefused, match=r"idx: its live version is v000003, but this was loaded from \(or last "
                                          r"saved as\) v000001: another writer saved .*overwrite=True"):
        a.save(folder)
    assert {"zz.b1", "zz.b2"} <= {t.id for t in ToolScout.load(folder).tools}  # b's save is untouched
    a.save(tmp_path / "elsewhere")  # another directory: nothing there was read, nothing to lose
    a.save(folder, overwrite=True)
    assert "zz.a" in ToolScout.load(folder) and "zz.b1" not in ToolScout.load(folder)
    ToolScout.from_tools(tools[:2], retriever="bm25").save(folder)  # a new index over an old one, as `index --out`
    assert len(ToolScout.load(folder)) == 2


def test_searches_get_through_while_a_thread_writes_back_to_back(tools):
    """With one thread calling add()/remove() in a tight loop, searches all but stopped (2483 in 15 s down to
    11): each ending write let the next one in before the waiting readers. Readers waiting when a write ends
    now go before the next one, so each search waits through at most the write under way and one queued
    (counted: the writer's tally may lag a write at either end, hence 3)."""
    scout = ToolScout.from_tools(tools, retriever="bm25")
    writes, done = [0], threading.Event()

    def write_back_to_back():
        while not done.is_set() and writes[0] < 5000:
            scout.add([Tool("zz.churn", "churn", "Send an email, then forget it")])
            scout.remove(["zz.churn"])
            writes[0] += 2

    waited = []

    def search(n):
        for _ in range(n):
            before = writes[0]
            scout.search("send an email", k=3)
            waited.append(writes[0] - before)

    writer = threading.Thread(target=write_back_to_back)
    readers = [threading.Thread(target=search, args=(30,)) for _ in range(3)]
    writer.start()
    while writes[0] < 10:  # the writer is in its loop before any search starts
        pass
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join()
    done.set()
    writer.join()
    assert len(waited) == 90 and max(waited) <= 3, sorted(waited)[-10:]


def test_a_task_of_invisible_characters_only_is_refused_as_blank(tools):
    """A zero-width space (or a byte-order mark, a word joiner...) says no more than white space does: it was
    searched, and answered with hits and probabilities. Blank is white space, control characters and what
    Unicode renders invisible (Default_Ignorable_Code_Point); nothing visible is."""
    import sys
    import unicodedata

    from toolscout.errors import InvalidRequest, is_blank

    scout = ToolScout.from_tools(tools, retriever="bm25")
    for task in ("\u200b", "\ufeff\u2060", " \u200d\t", "\U000e0041\U000e007f"):
        with pytest.raises(InvalidRequest, match="each query must be a string with something visible in it"):
            scout.search(task)
    assert [h.tool.id for h in scout.search("send an \u200bemail", k=1)] == ["mail.send"]
    characters = [chr(c) for c in range(sys.maxunicode + 1)]
    assert all(is_blank(c) for c in characters if c.isspace() or unicodedata.category(c) == "Cc")
    invisible_kinds = {"Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Cn", "Lo"}  # Lo, Mn: Hangul fillers, variation selectors
    assert {unicodedata.category(c) for c in characters if is_blank(c)} == invisible_kinds
    assert all(unicodedata.name(c, "").startswith(("HANGUL", "HALFWIDTH HANGUL", "KHMER VOWEL INHERENT"))
               for c in characters if is_blank(c) and unicodedata.category(c) == "Lo")


def test_every_reader_of_a_pipeline_directory_reads_the_format_it_writes_and_refuses_a_newer_one(tmp_path, tools):
    """`recorded_spec` read pipeline configs with the default format limit (1): a directory of the format
    `save` writes was taken for no pipeline directory (a PostgreSQL pointer served as an empty local index)."""
    import json

    from toolscout.artifacts import ArtifactError
    from toolscout.postgres import recorded_spec
    from toolscout.spec import PIPELINE_FORMAT

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    config_file = folder / (folder / "CURRENT").read_text().strip() / "config.json"
    config = json.loads(config_file.read_text())
    assert config["format_version"] == PIPELINE_FORMAT > 1
    config["postgres"] = "postgresql://db.example/toolscout?table=t"
    config_file.write_text(json.dumps(config))
    assert recorded_spec(folder) == "postgresql://db.example/toolscout?table=t"
    config["format_version"] = PIPELINE_FORMAT + 1
    config_file.write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=f"format_version {PIPELINE_FORMAT + 1} is not supported.*upgrade toolscout"):
        ToolScout.load(folder)


def test_a_config_without_a_format_version_or_with_none_ever_written_is_called_damaged(tmp_path, tools):
    """A config.json with no format_version said "format_version None is not supported ...; upgrade
    toolscout", which cannot help; format_version 0 loaded without a word."""
    import json

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    config_file = folder / (folder / "CURRENT").read_text().strip() / "config.json"
    config = json.loads(config_file.read_text())
    for value, says in ((None, "has no format_version, so it is not a toolscout index or model config, or it is "
                               "damaged"),
                        (0, "has format_version 0, which no toolscout writes"),
                        (True, "has format_version True, which no toolscout writes"),
                        ("3", "has format_version '3', which no toolscout writes")):
        if value is None:
            config.pop("format_version", None)
        else:
            config["format_version"] = value
        config_file.write_text(json.dumps(config))
        with pytest.raises(ArtifactError) as caught:
            ToolScout.load(folder)
        assert says in str(caught.value) and "upgrade" not in str(caught.value)


# every file a learned default index (BM25 + dense, feedback learned) saves, relative to its folder
SAVED_FILES = ["CURRENT", "v000001/config.json", "v000001/feedback.json", "v000001/learning/config.json",
               "v000001/learning/memory.json", "v000001/learning/scorecard.jsonl", "v000001/learning/vectors.npy",
               "v000001/retriever/component0/config.json", "v000001/retriever/component0/tokens.jsonl",
               "v000001/retriever/component1/config.json", "v000001/retriever/component1/hashes.json",
               "v000001/retriever/component1/store/ids.json", "v000001/retriever/component1/store/vectors.npy",
               "v000001/retriever/config.json", "v000001/tools.jsonl"]


@pytest.fixture(scope="module")
def learned_index(tmp_path_factory, encoder):
    from conftest import sample_tools

    root = tmp_path_factory.mktemp("saved") / "idx"
    scout = ToolScout.from_tools(sample_tools(), encoder=encoder)
    scout.learn([{"query": f"book me a flight to city {i}", "tool_ids": [scout.tools[0].id]} for i in range(3)])
    scout.save(root)
    return root


def test_the_damage_test_covers_every_file_an_index_saves(learned_index):
    saved = [p for p in learned_index.rglob("*") if p.is_file() and p.name not in ("write.lock", "claim.lock")]  # locks, no data
    assert sorted(str(p.relative_to(learned_index)) for p in saved) == SAVED_FILES


@pytest.mark.parametrize("cut", ["half", "empty"])
@pytest.mark.parametrize("name", SAVED_FILES)
def test_a_damaged_index_file_is_named_and_the_folder_called_damaged(learned_index, tmp_path, name, cut):
    """Each file of a saved index cut to half its size, or to nothing: loading fails with an ArtifactError that
    names that file (CURRENT: the folder and CURRENT) and says the folder is damaged, never a bare numpy or JSON
    error, and never a load that ignores it."""
    import shutil

    root = tmp_path / "idx"
    shutil.copytree(learned_index, root)
    damaged = root / name
    damaged.write_bytes(damaged.read_bytes()[:damaged.stat().st_size // 2] if cut == "half" else b"")
    with pytest.raises(ArtifactError) as caught:
        ToolScout.load(root)
    said = str(caught.value)
    assert "damaged" in said
    assert f"{root}: CURRENT" in said if name == "CURRENT" else str(damaged) in said or (
        name.endswith("tokens.jsonl") and cut == "empty" and "its retriever holds 0 tools" in said)


def test_readers_queued_behind_a_writer_go_on_when_that_writer_is_interrupted_while_waiting():
    """A writer interrupted in its wait (KeyboardInterrupt) stopped counting itself as waiting but woke no
    one, so a reader queued behind it slept until some other lock event (review #8). Here: a reader holds
    the lock, a writer waits for it, a second reader queues behind the writer, and the writer's wait raises;
    the second reader must now read while the first still holds the lock."""
    from toolscout.pipeline import ReadWriteLock

    class Interrupted(Exception):
        pass

    lock = ReadWriteLock()
    entered = {"writer": threading.Event(), "reader": threading.Event()}
    interrupt = threading.Event()

    class InterruptibleCondition(threading.Condition):
        def wait(self, timeout=None):
            entered[threading.current_thread().name].set()  # the condition is held until wait() releases it
            woke = super().wait(timeout)
            if interrupt.is_set() and threading.current_thread().name == "writer":
                raise Interrupted
            return woke

    lock._cond = InterruptibleCondition(threading.Lock())
    read_while_held, writer_raised = threading.Event(), []

    def write():
        try:
            with lock.write():
                pass
        except Interrupted:
            writer_raised.append(True)

    def read():
        with lock.read():
            read_while_held.set()

    first = lock.read()
    first.__enter__()
    try:
        writer = threading.Thread(target=write, name="writer", daemon=True)
        writer.start()
        assert entered["writer"].wait(5)
        reader = threading.Thread(target=read, name="reader", daemon=True)
        reader.start()
        assert entered["reader"].wait(5)
        with lock._cond:  # both are in wait(): wake the writer alone (the first waiter) to be interrupted
            interrupt.set()
            lock._cond.notify(1)
        writer.join(5)
        assert writer_raised == [True]
        assert read_while_held.wait(2), "the reader queued behind the interrupted writer still sleeps"
    finally:
        first.__exit__(None, None, None)
    reader.join(5)
    assert not reader.is_alive()


_SAVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from toolscout import artifacts

    real_check = artifacts.check_live_version
    def check_then_pause(root, expected):  # hold the writer between its version check and its commit
        real_check(root, expected)
        if sys.argv[3] == "pause" and body_done:  # the check at the commit, after the body
            print("checked", flush=True)
            sys.stdin.readline()
    artifacts.check_live_version = check_then_pause
    body_done = []
    try:
        with artifacts.write_artifact(Path(sys.argv[1]), {"kind": "x", "format_version": 1},
                                      expected_version=sys.argv[2]) as folder:
            print("written", flush=True)
            body_done.append(True)
            (folder / "who").write_text(sys.argv[3])
    except artifacts.SaveRefused:
        print("refused", flush=True)
        sys.exit(3)
""")


def test_two_processes_saving_over_the_same_version_cannot_both_commit(tmp_path):
    """The stale-version check before a save's commit was check-then-replace without a lock: two processes
    that loaded the same version could both pass it, and the later one silently discarded the other's save
    (review #9). Now the check and the commit hold DIR/write.lock: a second writer checks after the first
    committed, and is refused. The first writer is paused right after its check (its lock held, when locked)."""
    root = tmp_path / "idx"
    with write_artifact(root, {"kind": "x", "format_version": 1}):
        pass
    loaded = (root / "CURRENT").read_text().strip()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def saver(mode):
        return subprocess.Popen([sys.executable, "-c", _SAVER, str(root), loaded, mode], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    first = saver("pause")
    assert first.stdout.readline() == "written\n" and first.stdout.readline() == "checked\n"
    second = saver("go")
    assert second.stdout.readline() == "written\n"  # its body is done: next, its check and commit
    try:
        second.wait(1.5)  # unlocked, it commits over the paused first writer's check at once
    except subprocess.TimeoutExpired:
        pass  # waiting on the first writer's lock
    first.stdin.write("\n")
    first.stdin.flush()
    codes = sorted([first.wait(10), second.wait(10)])
    assert codes == [0, 3], "both writers committed over the version they loaded"
    assert (root / (root / "CURRENT").read_text().strip() / "who").read_text() == "pause"

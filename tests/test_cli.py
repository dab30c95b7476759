import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from toolscout.cli import main
from toolscout.pipeline import DEFAULT_INTENT_MERGE

CATALOGS = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs"
EVAL_SETS = Path(__file__).parent / "fixtures" / "eval"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_index_openapi_and_mcp_then_search_json(capsys, tmp_path):
    idx = tmp_path / "idx"
    code, _, err = run(capsys, "index", CATALOGS / "petstore_openapi.yaml", CATALOGS / "mcp_reference_servers.json",
                       "--out", idx, "--retriever", "bm25")
    assert code == 0, err
    assert "19 tools (openapi)" in err and "26 tools (mcp)" in err and "indexed 45 tools" in err

    code, out, _ = run(capsys, "search", idx, "delete a pet by its id", "-k", "3", "--json")
    hits = json.loads(out)["hits"]
    assert hits[0]["name"] == "deletePet" and hits[0]["method"] == "DELETE" and hits[0]["path"] == "/pet/{petId}"
    assert set(hits[0]) >= {"id", "name", "namespace", "score", "method", "path"}

    code, out, _ = run(capsys, "search", idx, "read the contents of a file", "-k", "5", "--json",
                       "--namespace", "filesystem")
    hits = json.loads(out)["hits"]
    assert hits and all(h["namespace"] == "filesystem" for h in hits) and "method" not in hits[0]
    assert hits[0]["name"] in {"read_text_file", "read_file", "read_multiple_files"}

    code, out, _ = run(capsys, "search", idx, "what time is it in Tokyo", "-k", "2")
    assert code == 0 and "get_current_time" in out  # the human table


def test_search_several_tasks_in_one_call(capsys, tmp_path):
    run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", tmp_path / "i", "--retriever", "bm25")
    code, out, _ = run(capsys, "search", tmp_path / "i", "fetch a web page", "create entities in memory", "--json")
    data = json.loads(out)
    assert [d["query"] for d in data] == ["fetch a web page", "create entities in memory"]
    assert data[0]["hits"][0]["namespace"] == "fetch" and data[1]["hits"][0]["namespace"] == "memory"


def test_errors_name_the_problem_and_exit_non_zero(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"tools": [{"name": "x", "inputSchema": 5}]}')
    code, _, err = run(capsys, "index", bad, "--out", tmp_path / "i", "--retriever", "bm25")
    assert code == 1 and "bad.json" in err and "inputSchema" in err
    assert not (tmp_path / "i").exists()
    code, _, err = run(capsys, "search", tmp_path / "missing", "x")
    assert code == 1 and "missing" in err
    code, _, err = run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "j", "--retriever", "nope")
    assert code == 1 and "known: bm25, dense" in err
    run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "k", "--retriever", "bm25")
    (tmp_path / "k" / "CURRENT").write_text("v000009")  # copied in part: the version it names is not there
    code, _, err = run(capsys, "search", tmp_path / "k", "x")
    assert code == 1 and "CURRENT names the version 'v000009', which is not there" in err


@pytest.mark.parametrize("command", ["search", "serve"])
def test_search_and_serve_name_a_damaged_index_file_and_exit_1(capsys, tmp_path, command):
    """An empty store/vectors.npy (a disk that filled up mid-copy): a one-line error naming it and saying the
    folder is damaged, not a numpy traceback; serve stops before it listens."""
    idx = tmp_path / "idx"
    assert run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx, "--retriever", "dense")[0] == 0
    vectors = next(idx.glob("v*/retriever/store/vectors.npy"))
    vectors.write_bytes(b"")
    argv = [idx, "read a file"] if command == "search" else [idx, "--port", "18453"]
    code, _, err = run(capsys, command, *argv)
    assert code == 1 and f"{vectors}: not a whole numpy file" in err
    assert f"the index folder {idx} is damaged: index the catalog again, or restore the folder" in err


def test_search_in_a_namespace_no_tool_is_in_says_so(capsys, tmp_path):
    """A typo in --namespace read as a search that found nothing."""
    import warnings

    from toolscout.hits import UnknownNamesWarning

    idx = tmp_path / "idx"
    assert run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx, "--retriever", "bm25")[0] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownNamesWarning)  # said once, in the command's words, not twice
        code, _, err = run(capsys, "search", idx, "read a file", "--namespace", "filesystm", "--namespace", "filesystem")
    assert code == 0 and "warning: no tool is in namespace 'filesystm'" in err and "'filesystem'" not in err
    code, _, err = run(capsys, "search", idx, "read a file", "--namespace", "filesystem")
    assert code == 0 and "warning" not in err
    # --json says it too, and whether the search abstained, as POST /search does
    code, out, _ = run(capsys, "search", idx, "read a file", "--namespace", "filesystm", "--json")
    assert json.loads(out) == {"query": "read a file", "abstained": True, "hits": [],
                               "unknown_namespaces": ["filesystm"]}
    code, out, _ = run(capsys, "search", idx, "read a file", "qwxzv plork", "--namespace", "filesystem", "--json")
    found, nothing = json.loads(out)
    assert (found["abstained"], bool(found["hits"]), found["unknown_namespaces"]) == (False, True, [])
    assert nothing == {"query": "qwxzv plork", "abstained": True, "hits": [], "unknown_namespaces": []}


def test_index_shows_how_far_the_embedding_of_a_large_catalog_is_unless_quiet(capsys, tmp_path, monkeypatch):
    """Indexing thousands of tools took minutes with nothing printed after the catalogs' lines. 45 tools count
    as large here, so that the bar shows in a second."""
    from toolscout import encoders

    monkeypatch.setattr(encoders, "PROGRESS_FROM", 40)
    catalogs = [CATALOGS / "petstore_openapi.yaml", CATALOGS / "mcp_reference_servers.json"]
    code, _, err = run(capsys, "index", *catalogs, "--out", tmp_path / "idx", "--retriever", "dense")
    assert code == 0, err
    # counted per text where the int8 encoding runs each text alone, per batch where float32 batches them
    # (a CPU whose int8 differs from the checked one: docs/install.md)
    assert re.search(r"encoding: 100%\|[^|]*\| (\d+)/\1 ", err), err
    code, _, err = run(capsys, "index", *catalogs, "--out", tmp_path / "quiet", "--retriever", "dense", "--quiet")
    assert code == 0 and "encoding" not in err and "indexed 45 tools" in err
    monkeypatch.setattr(encoders, "PROGRESS_FROM", 46)  # one tool more than the catalog: no bar
    code, _, err = run(capsys, "index", *catalogs, "--out", tmp_path / "small", "--retriever", "dense")
    assert code == 0 and "encoding" not in err


def test_index_takes_a_text_view_as_json_and_names_a_setting_it_does_not_know(capsys, tmp_path):
    from toolscout.tool import TextView

    code, _, err = run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "idx", "-o",
                       'view={"parameters": false, "descriptions": "as-written"}', "--retriever", "bm25")
    assert code == 0, err
    saved = json.loads(next((tmp_path / "idx").glob("v*/retriever/config.json")).read_text())["view"]
    assert TextView.from_dict(saved) == TextView(parameters=False, descriptions="as-written")
    code, _, err = run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "bad", "-o",
                       'view={"parmeters": false}', "--retriever", "bm25")
    assert code == 1 and "text view: unknown setting(s) ['parmeters']" in err and not (tmp_path / "bad").exists()


def test_index_refuses_a_setting_its_retriever_cannot_use_and_keeps_the_index_it_had(capsys, tmp_path):
    catalog, idx = CATALOGS / "petstore_openapi.yaml", tmp_path / "idx"
    assert run(capsys, "index", catalog, "--out", idx, "--retriever", "bm25")[0] == 0
    current = (idx / "CURRENT").read_text()
    for options, says in (
            (["-o", "k1=abc"], "the bm25 retriever: setting k1='abc' is not a number"),
            (["-o", "b=null"], "the bm25 retriever: setting b=None is not a number"),
            (["-o", "b=5"], "b one from 0 to 1, got k1=1.5, b=5"),
            (["-o", "nope=1"], "the bm25 retriever: unknown setting(s) 'nope'; it takes b, k1, stemmer, stopwords, view"),
            (["-o", "view=5"], "the bm25 retriever: setting view=5 is not a TextView or null"),
            (["-o", "intents=5"], "-o intents=...: not a setting of the retriever; use --no-split")):
        code, _, err = run(capsys, "index", catalog, "--out", idx, "--retriever", "bm25", *options)
        assert code == 1 and says in err and "Traceback" not in err, (options, err)
    assert (idx / "CURRENT").read_text() == current  # the working index was not replaced
    code, out, err = run(capsys, "search", idx, "find a pet by its id", "--json")
    assert code == 0, err


def test_a_hybrid_says_which_component_refused_a_setting_it_passed_on():
    from toolscout import ToolScout
    from toolscout.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match=r"the dense retriever: unknown setting\(s\) 'nope'; .* \(the hybrid "
                                             "retriever passes each setting it does not take itself"):
        ToolScout.from_tools([], retriever="hybrid", nope=1)
    with pytest.raises(InvalidRequest, match="the hybrid retriever: weights are a list of numbers"):
        ToolScout.from_tools([], retriever="hybrid", weights=["a", 1])
    with pytest.raises(InvalidRequest, match="rrf_k is above 0"):
        ToolScout.from_tools([], retriever="hybrid", rrf_k=0, components=["bm25", "bm25"])


def test_a_faiss_factory_string_faiss_cannot_read_is_refused_by_name():
    pytest.importorskip("faiss", reason="faiss-cpu is an optional extra ([faiss])")
    from toolscout.errors import InvalidRequest
    from toolscout.store.local import FaissStore

    with pytest.raises(InvalidRequest, match=r"store faiss:Bogus: FAISS cannot make that index \(could not parse "
                                             r"index string Bogus\)"):
        FaissStore(8, "Bogus")


def test_output_into_a_pipe_its_reader_closed_ends_quietly(capsys, tmp_path):
    import os
    import subprocess
    import sys

    assert run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "idx", "--retriever",
               "bm25")[0] == 0
    read, write = os.pipe()
    os.close(read)  # as `| head -1` does once it has its line
    try:
        done = subprocess.run([sys.executable, "-m", "toolscout", "search", str(tmp_path / "idx"), "find a pet",
                               "--json"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_serve_warns_of_an_always_included_id_no_tool_has(capsys, tmp_path):
    from toolscout.cli import build_parser
    from toolscout.cli.serve import _open_service
    from toolscout.serve.auth import AuthConfig

    assert run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "idx", "--retriever",
               "bm25")[0] == 0
    args = build_parser().parse_args(["serve", str(tmp_path / "idx"), "--always-include",
                                      "swagger-petstore-openapi-3-0.addPet", "--always-include", "petstore.addPet"])
    with _open_service(args, AuthConfig()):
        pass
    err = capsys.readouterr().err
    assert "warning: --always-include petstore.addPet: no tool has that id now" in err
    assert "openapi-3-0.addPet" not in err  # the one the catalog has is not warned of


def test_a_model_path_that_does_not_exist_is_said_to_be_missing(capsys, tmp_path):
    # it went to the model hub's loader, which answered with its rules for repository names
    for model in (tmp_path / "no-such-model", "./no-such-model"):
        code, _, err = run(capsys, "index", CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "idx",
                           "--retriever", "dense", "--model", model)
        assert code == 1 and f"encoder '{model}': no such model folder" in err, err
        assert "Repo id" not in err and not (tmp_path / "idx").exists()


def test_lenient_index_skips_and_reports_bad_tools(capsys, tmp_path):
    bad = tmp_path / "mixed.json"
    bad.write_text(json.dumps({"tools": [
        {"name": "good", "description": "fine", "inputSchema": {"type": "object"}},
        {"name": "bad", "inputSchema": 5}]}))
    code, _, err = run(capsys, "index", bad, "--out", tmp_path / "i", "--retriever", "bm25", "--lenient")
    assert code == 0 and "indexed 1 tools" in err
    assert f"warning: {bad}: tools[1].inputSchema: field 'inputSchema' must be a JSON schema object, got integer " \
           "(skipped)\n" in err  # the file named once


def test_index_prints_the_warnings_of_each_load(capsys, tmp_path):
    spec = tmp_path / "ext.yaml"
    spec.write_text("openapi: 3.0.0\ninfo: {title: Ext}\npaths:\n  /a:\n    get:\n      operationId: a\n"
                    "      parameters: [{name: p, in: query, schema: {$ref: 'common.yaml#/P'}}]\n")
    code, _, err = run(capsys, "index", spec, "--out", tmp_path / "i", "--retriever", "bm25", "--lenient")
    assert code == 0, err
    assert f"warning: {spec}: paths./a.get.parameters[0].schema: $ref 'common.yaml#/P' points outside this file and was " \
           "kept unresolved\n" in err


def test_a_tool_id_in_two_catalogs_names_both_and_namespaces_per_catalog_resolve_it(capsys, tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    for path, text in ((one, "Look up the weather"), (two, "Look up a word")):
        path.write_text(json.dumps([{"type": "function", "function": {"name": "lookup", "description": text}}]))
    code, _, err = run(capsys, "index", one, two, "--out", tmp_path / "i", "--retriever", "bm25")
    assert code == 1 and f"duplicate tool id 'lookup': in {one} and in {two}" in err
    assert "--namespace once per catalog" in err
    code, _, err = run(capsys, "index", one, two, "--namespace", "weather", "--namespace", "words",
                       "--out", tmp_path / "i", "--retriever", "bm25")
    assert code == 0 and "indexed 2 tools" in err, err
    code, out, _ = run(capsys, "search", tmp_path / "i", "look up the weather", "--json")
    assert json.loads(out)["hits"][0]["id"] == "weather.lookup"
    code, _, err = run(capsys, "index", one, two, "--namespace", "weather", "--out", tmp_path / "j")
    assert code == 1 and "1 --namespace for 2 catalogs: give one per catalog" in err


def test_catalogs_that_give_no_tool_are_told_and_indexing_nothing_fails(capsys, tmp_path):
    webhooks = tmp_path / "hooks.yaml"
    webhooks.write_text("openapi: 3.1.0\ninfo: {title: Hooks}\nwebhooks:\n  newPet:\n    post: {operationId: n}\n")
    code, _, err = run(capsys, "index", webhooks, "--out", tmp_path / "i", "--retriever", "bm25")
    assert code == 1 and f"warning: {webhooks}: no tools loaded: it holds none" in err and "'webhooks'" in err
    assert f"error: nothing to index: {webhooks} gave no tools" in err and not (tmp_path / "i").exists()
    code, _, err = run(capsys, "index", webhooks, CATALOGS / "petstore_openapi.yaml", "--out", tmp_path / "i",
                       "--retriever", "bm25")
    assert code == 0 and f"warning: {webhooks}: no tools loaded" in err and "indexed 19 tools" in err


@pytest.mark.slow  # indexes and evaluates whole sets
def test_eval_writes_the_design_json_shape(capsys, tmp_path):
    out_json, plot = tmp_path / "m.json", tmp_path / "p.png"
    code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", EVAL_SETS / "beta", "--retriever", "bm25",
                         "--json", out_json, "--quiet", "-k", "5")
    assert code == 0, err
    data = json.loads(out_json.read_text())
    assert set(data["sets"]) == {"alpha", "beta"}
    assert set(data["sets"]["alpha"]) == {"ndcg@5", "recall@5", "completeness@5", "mrr@5", "queries"}
    assert set(data["latency_ms"]) == {"p50", "p99"}
    # the figures against ranx (and completeness by hand) on the rankings the same pipeline gives
    expected = {name: reference_metrics(EVAL_SETS / name, k=5) for name in ("alpha", "beta")}
    for name, metrics in expected.items():
        for key, value in metrics.items():
            assert data["sets"][name][key] == pytest.approx(value, abs=0.01), (name, key)
    for key in ("ndcg@5", "recall@5", "completeness@5", "mrr@5"):
        assert data["mean"][key] == pytest.approx((expected["alpha"][key] + expected["beta"][key]) / 2, abs=0.01)

    code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", EVAL_SETS / "beta", "--retriever", "bm25",
                         "--retriever", "dense", "--json", out_json, "--plot", plot, "--quiet", "--bootstrap", "500")
    assert code == 0, err
    data = json.loads(out_json.read_text())
    assert set(data["systems"]) == {"bm25", "dense"} and data["comparisons"][0]["b"] == "dense"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the bootstrap pools alpha's 8 and beta's 8 labelled queries, unlike the table's macro mean: said so
    comparison = next(line for line in out.splitlines() if line.startswith("dense vs bm25: ndcg@10: B − A = "))
    assert comparison.endswith("pooled over 16 queries of 2 sets") and data["comparisons"][0]["n_queries"] == 16
    # the p beside the two-sided interval is two-sided, and says so; the JSON keeps both, named
    assert f"p = {data['comparisons'][0]['p_two_sided']:.4f} (two-sided: B ≠ A)" in comparison
    assert {"p_two_sided", "p_one_sided"} <= set(data["comparisons"][0]) and "p_value" not in data["comparisons"][0]

    code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--retriever", "dense",
                         "--json", out_json, "--quiet", "--bootstrap", "0")  # 0: the systems, not compared
    assert code == 0, err
    data = json.loads(out_json.read_text())
    assert set(data["systems"]) == {"bm25", "dense"} and data["comparisons"] == []
    with pytest.raises(SystemExit):  # refused before any set is evaluated
        run(capsys, "eval", EVAL_SETS / "alpha", "--bootstrap", "-1")
    assert "argument --bootstrap: expected a number at least 0, got '-1'" in capsys.readouterr().err


def test_eval_plot_without_matplotlib_is_refused_before_the_evaluation(capsys, tmp_path, monkeypatch):
    # a lean install: --plot failed after the whole evaluation had run
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else
                        find_spec(name, *a))
    out_json = tmp_path / "m.json"
    code, _, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--json", out_json,
                       "--plot", tmp_path / "p.png", "--quiet")
    assert code == 1 and "matplotlib" in err and "pip install" in err
    assert not out_json.exists()  # nothing was evaluated


def test_eval_plot_to_a_format_matplotlib_cannot_write_is_refused_before_the_evaluation(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the [plot] extra")
    out_json = tmp_path / "m.json"
    code, _, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--json", out_json,
                       "--plot", tmp_path / "p.txt", "--quiet")
    assert code == 1 and f"--plot {tmp_path / 'p.txt'}: matplotlib writes " in err and "png" in err, err
    assert not out_json.exists()  # nothing was evaluated


def test_eval_says_what_it_skipped_on_stderr_and_in_the_json(capsys, tmp_path):
    """beta's b9 has no labels and gamma_corpus has no queries.jsonl: both are left out, and said so."""
    out_json = tmp_path / "r.json"
    skipped = ["beta: skipped 1 test queries with no labels (first: 'b9')", "gamma_corpus: no queries.jsonl; set skipped"]
    code, out, err = run(capsys, "eval", EVAL_SETS / "beta", EVAL_SETS / "gamma_corpus", "--retriever", "bm25",
                         "--json", out_json, "--quiet")
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("warning: ")] == [f"warning: {w}" for w in skipped]
    data = json.loads(out_json.read_text())
    assert data["warnings"] == skipped and set(data["sets"]) == {"beta"} and data["sets"]["beta"]["queries"] == 8
    code, out, err = run(capsys, "eval", EVAL_SETS / "beta", EVAL_SETS / "gamma_corpus", "--retriever", "bm25",
                         "--retriever", "dense", "--json", out_json, "--quiet", "--bootstrap", "0")
    assert code == 0, err
    assert err.count("warning: ") == 2  # once, though both systems skipped the same
    assert all(system["warnings"] == skipped for system in json.loads(out_json.read_text())["systems"].values())


def reference_metrics(folder, k):
    """nDCG, recall and MRR at k and completeness, each worked out here from its textbook definition (binary
    relevance; ranx agrees with toolscout's metrics in test_eval_metrics, and costs a numba compile per process),
    in points, for the BM25 pipeline's rankings of the set's labelled test queries (each ranked alone; `eval`
    skips unlabelled ones)."""
    from toolscout import ToolScout
    from toolscout.benchmark_sets import load_benchmark

    bench = load_benchmark(folder)
    scout = ToolScout.from_tools(bench.tools, retriever="bm25")
    queries = [q for q in bench.split("test") if q.labels]
    per_query = []
    for q in queries:
        ranked, gold = list(scout.retrieve([q.text], k).ids[0])[:k], set(q.labels)
        dcg = sum(1 / math.log2(rank + 1) for rank, tid in enumerate(ranked, 1) if tid in gold)
        ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))
        first = next((rank for rank, tid in enumerate(ranked, 1) if tid in gold), None)
        per_query.append((dcg / ideal, len(gold & set(ranked)) / len(gold), 1 / first if first else 0.0,
                          float(gold <= set(ranked))))
    names = (f"ndcg@{k}", f"recall@{k}", f"mrr@{k}", f"completeness@{k}")
    return {name: 100 * sum(row[i] for row in per_query) / len(per_query) for i, name in enumerate(names)}


def test_demo_indexes_the_bundled_catalog(capsys, tmp_path):
    code, out, _ = run(capsys, "demo", "--out", tmp_path / "demo", "--retriever", "bm25")
    assert code == 0 and "AppointmentRegistration" in out and "AddReminder" in out
    assert (tmp_path / "demo" / "CURRENT").exists()



@pytest.mark.parametrize("command", ["index", "demo"])
def test_index_out_onto_a_trained_model_is_refused_before_the_build(capsys, tmp_path, command):
    """`index --out` / `demo --out` naming a `toolscout train` output: refused (exit 1) naming the folder and
    the model it holds; the model folder is left exactly as it was (no lock or journal added)."""
    from toolscout.artifacts import write_artifact
    from toolscout.models import model_base

    model = tmp_path / "mlc"
    with write_artifact(model, model_base("mlc")) as folder:
        (folder / "weights.bin").write_bytes(b"hours of training")
    before = sorted(str(p.relative_to(model)) for p in model.rglob("*"))
    catalog = [CATALOGS / "mcp_reference_servers.json"] if command == "index" else []
    code, _, err = run(capsys, command, *catalog, "--out", model, "--retriever", "bm25")
    assert code == 1 and f"{model}: holds a trained 'mlc' model" in err and "indexed" not in err
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*")) == before

def _updated_reference_catalog(tmp_path):
    """The bundled MCP reference catalog without `time.convert_time`, with a weather server added."""
    servers = json.loads((CATALOGS / "mcp_reference_servers.json").read_text())
    for server in servers:
        server["tools"] = [t for t in server["tools"] if t["name"] != "convert_time"]
    servers.append({"server": "weather", "tools": [{"name": "forecast", "description": "Weather forecast for a city.",
                                                    "inputSchema": {"type": "object", "properties": {}}}]})
    path = tmp_path / "updated.json"
    path.write_text(json.dumps(servers))
    return path


def _write_log(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_reindexing_a_spec_whose_ids_changed_names_the_likely_renames_and_the_namespace_flag(capsys, tmp_path):
    spec = {"openapi": "3.0.3", "info": {"title": "Orders", "version": "1"}, "paths": {
        "/orders": {"get": {"operationId": "listOrders", "summary": "List all orders"},
                    "post": {"operationId": "createOrder", "summary": "Place a new order"}},
        "/orders/{id}": {"get": {"operationId": "getOrder", "summary": "Show one order",
                                 "parameters": [{"name": "id", "in": "path", "required": True}]}}}}
    idx = tmp_path / "idx"
    (tmp_path / "v1.json").write_text(json.dumps(spec))
    assert run(capsys, "index", tmp_path / "v1.json", "--out", idx, "--retriever", "bm25")[0] == 0
    log = _write_log(tmp_path / "log.jsonl", [{"query": "show me order 42", "tool_ids": ["orders.getOrder"]},
                                              {"query": "place an order for ACME", "tool_ids": ["orders.createOrder"]}])
    assert run(capsys, "learn", idx, log)[0] == 0
    del spec["paths"]["/orders/{id}"]["get"]["operationId"]  # its id becomes 'GET /orders/{id}'
    (tmp_path / "v2.json").write_text(json.dumps(spec))
    code, _, err = run(capsys, "index", tmp_path / "v2.json", "--out", idx, "--retriever", "bm25")
    assert code == 0 and "1 (tool, request) pairs; dropped 1 whose tool is no longer in the catalog" in err, err
    assert ("warning: likely renamed (the same HTTP method and path): 'orders.getOrder' is now "
            "'orders.GET /orders/{id}'; their feedback is not carried over to the new ids\n") in err
    spec["info"]["title"] = "Orders (v2)"  # every id moves to the namespace 'orders-v2'
    (tmp_path / "v3.json").write_text(json.dumps(spec))
    code, _, err = run(capsys, "index", tmp_path / "v3.json", "--out", idx, "--retriever", "bm25")
    assert code == 0 and "'orders.createOrder' is now 'orders-v2.createOrder'" in err, err
    assert ("namespace 'orders' is now 'orders-v2' (the API's title changed?): index it with --namespace orders to "
            "keep its ids") in err


def test_index_out_onto_a_learned_index_keeps_what_it_learned_for_the_tools_still_there(capsys, tmp_path):
    """`index NEW_CATALOG --out DIR` over an index that learned from feedback: the new index takes it over,
    as learning the surviving events on a fresh index of the new catalog gives (the oracle, built through the
    same commands), and says how many (tool, request) pairs it kept and how many it dropped with their tool."""
    from traffic import CALENDAR, FACTS, FILES, MAIL, RAIN, events

    from toolscout import ToolScout

    taught = (events(FILES, "filesystem.read_text_file", 12, start=0.0) + events(FACTS, "memory.create_entities", 12, start=100.0)
              + events(MAIL, "fetch.fetch", 12, start=200.0) + events(RAIN, "memory.search_nodes", 12, start=300.0)
              + events(RAIN[20:], "time.get_current_time", 12, start=400.0)
              + events(CALENDAR, "time.convert_time", 9, start=500.0))  # its tool leaves the catalog
    idx, oracle, new = tmp_path / "idx", tmp_path / "oracle", _updated_reference_catalog(tmp_path)
    assert run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx, "--retriever", "bm25")[0] == 0
    assert run(capsys, "learn", idx, _write_log(tmp_path / "all.jsonl", taught))[0] == 0
    code, _, err = run(capsys, "index", new, "--out", idx, "--retriever", "bm25")
    assert code == 0, err
    assert f"kept what {idx} learned from feedback: 60 (tool, request) pairs; dropped 9 whose tool" in err
    assert run(capsys, "index", new, "--out", oracle, "--retriever", "bm25")[0] == 0
    surviving = [e for e in taught if e["tool_ids"] != ["time.convert_time"]]
    assert run(capsys, "learn", oracle, _write_log(tmp_path / "surviving.jsonl", surviving))[0] == 0

    kept, fresh = ToolScout.load(idx), ToolScout.load(oracle)
    tasks = [FILES[0], FACTS[1], MAIL[2], RAIN[3], RAIN[25], "open my notes", "weather in Oslo"]
    got, want = kept.retrieve(tasks, 10), fresh.retrieve(tasks, 10)
    assert got.as_lists() == want.as_lists()
    assert all(np.array_equal(a, b) for a, b in zip(got.scores, want.scores))
    assert [(u.tool_id, u.query, u.untaught_rank) for u in kept.ledger.taught()] == \
        [(u.tool_id, u.query, u.untaught_rank) for u in fresh.ledger.taught()]
    assert kept.learning_report()["requests"] == fresh.learning_report()["requests"] > 0
    assert run(capsys, "index", new, "--out", tmp_path / "untaught", "--retriever", "bm25")[0] == 0
    untaught = ToolScout.load(tmp_path / "untaught").retrieve(tasks, 10).as_lists()
    assert sum(a != b for a, b in zip(got.as_lists(), untaught)) >= 3  # what it learned moves rankings


def test_index_out_onto_a_learned_index_with_drop_learning_or_into_postgres(capsys, tmp_path):
    """--drop-learning replaces it without what it learned, and says so; an index into PostgreSQL cannot take
    it over and is refused (before connecting), naming the flag."""
    from traffic import FILES, events

    idx = tmp_path / "idx"
    run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx, "--retriever", "bm25")
    run(capsys, "learn", idx, _write_log(tmp_path / "log.jsonl", events(FILES, "filesystem.read_text_file", 5)))
    code, _, err = run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx,
                       "--store", "postgresql://nobody@127.0.0.1:1/none")
    assert code == 1 and "--drop-learning" in err and "learned from feedback" in err
    code, _, err = run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--out", idx, "--retriever", "bm25",
                       "--drop-learning")
    assert code == 0 and f"--drop-learning: what {idx} learned from feedback is not kept" in err
    code, out, _ = run(capsys, "learning", "report", idx)
    assert code == 0 and "learned requests: 0" in out


def test_eval_model_dir_goes_only_to_the_retriever_it_trained(tmp_path):
    """`eval --retriever mlc --model MLC_DIR --retriever dense`: dense keeps its default encoder, and a
    trained dir given to retrievers none of which it trained is an error naming the right one."""
    from toolscout.artifacts import write_artifact
    from toolscout.cli.options import model_for as _model_for
    from toolscout.models import model_base

    out = tmp_path / "mlcdir"
    with write_artifact(out, model_base("mlc")):
        pass
    assert _model_for(str(out), "mlc") == str(out)
    assert _model_for(str(out), "dense") is None and _model_for(str(out), "bm25") is None
    assert _model_for("sentence-transformers/foo", "dense") == "sentence-transformers/foo"  # a plain name: everyone
    embed = tmp_path / "embeddir"
    with write_artifact(embed, model_base("embed")):
        pass
    assert _model_for(str(embed), "dense") == str(embed) and _model_for(str(embed), "hybrid") == str(embed)
    assert _model_for(str(embed), "tool2vec") is None
    fixture = Path(__file__).parent / "fixtures" / "eval" / "alpha"
    assert main(["eval", str(fixture), "--retriever", "bm25", "--model", str(out), "--quiet"]) == 1


def test_index_splits_multi_request_tasks_unless_told_not_to(capsys, tmp_path):
    from toolscout import ToolScout
    from toolscout.ingest import load_tools

    catalog = CATALOGS / "mcp_reference_servers.json"
    task = "fetch a url. Then create a new entity for the project and a relation to its owner"
    tools = load_tools(catalog)
    expected = {split: [h.tool.id for h in ToolScout.from_tools(
        tools, retriever="dense", intents=DEFAULT_INTENT_MERGE if split else None).search(task, k=5)]
        for split in (True, False)}
    # two requests: as one, the memory tools fill the top 5; split, the first request's tool comes back
    assert "fetch.fetch" in expected[True] and "fetch.fetch" not in expected[False]
    for split, flags in ((True, []), (False, ["--no-split"])):
        idx = tmp_path / f"idx-{split}"
        assert run(capsys, "index", catalog, "--out", idx, "--retriever", "dense", *flags)[0] == 0
        code, out, _ = run(capsys, "search", idx, task, "-k", "5", "--json")
        assert code == 0 and [h["id"] for h in json.loads(out)["hits"]] == expected[split]


@pytest.mark.parametrize("argv, says", [
    (["serve", "idx", "--port", "99999"], "argument --port: expected a number from 1 to 65535, got '99999'"),
    (["serve", "idx", "--port", "-1"], "argument --port: expected a number from 1 to 65535"),
    (["serve", "idx", "--max-body", "-5"], "argument --max-body: expected a number at least 1"),
    (["serve", "idx", "--min-score", "nan"], "argument --min-score: expected a finite number"),
    (["serve", "idx", "--feedback-cap", "0"], "argument --feedback-cap: expected a number at least 1"),
    (["serve", "idx", "--batch-workers", "two"], "argument --batch-workers: expected a whole number, got 'two'"),
    (["gateway", "servers.json", "--search-wait", "-1"], "argument --search-wait: expected a number at least 0"),
    (["gateway", "servers.json", "--port", "70000"], "argument --port: expected a number from 1 to 65535"),
    (["eval", "set", "--max-queries", "0"], "argument --max-queries: expected a number at least 1, got '0'"),
])
def test_numbers_out_of_range_are_refused_naming_the_flag_before_anything_starts(capsys, argv, says):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err




@pytest.mark.parametrize("retriever", ["tool2vec", "mlc"])
def test_index_refuses_an_untrained_tool2vec_or_mlc_as_eval_does(capsys, tmp_path, retriever):
    """`index --retriever tool2vec` without --model was built (ranking by descriptions alone under tool2vec's
    name) while eval refused it: both refuse, with eval's message, and nothing is written."""
    code, _, err = run(capsys, "index", CATALOGS / "mcp_reference_servers.json", "--retriever", retriever,
                       "--out", tmp_path / "idx")
    assert code == 1 and f"--retriever {retriever} needs --model DIR, a `toolscout train {retriever}` directory " \
        f"(none was given; write one with `toolscout train {retriever} --data SET_DIR --out DIR`)" in err, err
    assert not (tmp_path / "idx").exists()

def test_train_help_names_every_method(capsys):
    from toolscout.train import TRAINERS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    listed = help_text.split("what to train: ", 1)[1].split(" options:", 1)[0]
    assert all(re.search(rf"\b{method}\b", listed) for method in TRAINERS), listed
    assert "..." not in listed


@pytest.mark.parametrize("method, device, options, says", [
    ("cross", "cuda:99", [], "--device cuda:99: not available here (torch "),  # no such GPU here, with CUDA or without
    ("mlc", "tpu", [], "--device tpu: not a device name torch knows (cpu, cuda, cuda:1, mps, ...); devices here: "),
    ("tool2vec", "banana", [], "--device banana: tool2vec runs no torch model (only its -o finetune=true does)"),
    ("tool2vec", "banana", ["-o", "finetune=true"], "--device banana: not a device name torch knows"),
])
def test_train_device_is_checked_before_data_and_models_load(capsys, tmp_path, method, device, options, says):
    """A --device torch cannot use here, or given to a trainer that runs no torch model, is refused naming the
    flag before anything loads: the --data folder does not even exist, and that is not what is reported."""
    code, _, err = run(capsys, "train", method, "--data", tmp_path / "nosuchset", "--out", tmp_path / "m",
                       "--device", device, *options)
    assert code == 1 and says in err and "nosuchset" not in err, err
    assert not (tmp_path / "m").exists()


def test_trainconfig_device_is_checked_for_python_callers_too():
    from toolscout.train.loop import pick_device

    assert pick_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="TrainConfig.device banana: not a device name torch knows"):
        pick_device("banana")

@pytest.mark.parametrize("method, option, said", [
    ("tool2vec", "finetune_steps=abc", "tool2vec: option finetune_steps='abc' is not a whole number or null"),
    ("mlc", "head_lr=abc", "mlc: option head_lr='abc' is not a number"),
    ("toolclip", "tau=abc", "toolclip: option tau='abc' is not a number"),
    ("toolclip", "hard_k=1.5", "toolclip: option hard_k=1.5 is not a whole number"),
    ("embed", "negatives=[1]", "embed: option negatives=[1] is not a whole number"),
    ("cross", "depth=abc", "cross: option depth='abc' is not a whole number"),
    ("refiner", "depth=abc", "refiner: option depth='abc' is not a whole number"),
    ("tool2vec", 'finetune_options={"tau": "x"}', "embed (tool2vec's fine-tuning): option tau='x' is not a number"),
])
def test_train_refuses_an_option_of_the_wrong_type_naming_it(capsys, tmp_path, method, option, said):
    """`train toolclip -o tau=abc`, `mlc -o head_lr=abc`, `refiner -o depth=abc` ended in a TypeError
    traceback from deep in training. Every trainer's -o values are now checked against its option's type."""
    extra = ["-o", "finetune=true"] if "finetune_options" in option else []
    code, _, err = run(capsys, "train", method, "--data", CATALOGS / "apibank_sample", "--out", tmp_path / "m",
                       "-o", option, *extra, "--max-steps", "1", "--quiet")
    assert code == 1 and f"toolscout train: error: {said}" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("command", ["index", "eval"])
@pytest.mark.parametrize("flag, tier", [("--student-queries", "the query student"),
                                        ("--fast-queries", "the static query table")])
def test_a_fast_tier_on_a_pipeline_without_dense_retrieval_is_refused_naming_the_flag_given(capsys, tmp_path,
                                                                                          command, flag, tier):
    """--student-queries on bm25 was refused speaking of "fast queries", the other tier's flag."""
    where = ["--out", tmp_path / "i"] if command == "index" else ["--quiet"]
    code, _, err = run(capsys, command, CATALOGS / "apibank_sample", "--retriever", "bm25", flag, *where)
    assert code == 1 and err.rstrip().endswith(
        f"toolscout {command}: error: {flag}: {tier} encodes tasks for a dense retriever; this pipeline's "
        "retriever is 'bm25'")


def test_eval_and_train_refuse_mistakes_before_the_work_naming_what_to_do(capsys, tmp_path):
    from toolscout.artifacts import write_artifact
    from toolscout.models import model_base

    sample = CATALOGS / "apibank_sample"
    code, _, err = run(capsys, "train", "tool2vec", "--data", sample, "--out", tmp_path / "m", "-o", "nosuch=1")
    assert code == 1 and "-o nosuch: not an option of tool2vec; its options: encoder, finetune" in err
    assert not (tmp_path / "m").exists()
    with write_artifact(tmp_path / "cross", model_base("cross")):  # a second stage's model directory
        pass
    code, _, err = run(capsys, "eval", sample, "--retriever", "dense", "--model", tmp_path / "cross", "--quiet")
    assert code == 1 and f"is a 'cross' model; evaluate it with --rerank {tmp_path / 'cross'}" in err
    code, _, err = run(capsys, "train", "tool2vec", "--data", sample, "--out", tmp_path / "cross")
    assert code == 1 and "holds a 'cross' model; train tool2vec into another folder" in err
    with pytest.raises(SystemExit):  # an untrained model is not a model
        main(["train", "tool2vec", "--data", str(sample), "--out", str(tmp_path / "m"), "--epochs", "0"])
    (tmp_path / "afile").write_text("not a folder")
    code, _, err = run(capsys, "eval", sample, "--retriever", "bm25", "--json", tmp_path / "afile" / "r.json")
    assert code == 1 and f"--json {tmp_path / 'afile' / 'r.json'}: cannot make its folder: " in err
    code, _, err = run(capsys, "eval", sample, "--retriever", "bm25", "--model", "all-MiniLM-L6-v2")
    assert code == 1 and "--model all-MiniLM-L6-v2: none of --retriever bm25 takes a model" in err
    # an untrained tool2vec is a description retriever under another name: refused as an untrained mlc is
    for name, model, says in (("tool2vec", [], "none was given"), ("mlc", [], "none was given"),
                              ("tool2vec", ["--model", "all-MiniLM-L6-v2"], "--model all-MiniLM-L6-v2 is not one")):
        code, _, err = run(capsys, "eval", sample, "--retriever", name, *model, "--quiet")
        assert code == 1 and f"--retriever {name} needs --model DIR, a `toolscout train {name}` directory ({says}; " \
            f"write one with `toolscout train {name} --data SET_DIR --out DIR`)" in err, err
    assert run(capsys, "index", sample, "--out", tmp_path / "idx", "--retriever", "bm25")[0] == 0
    code, _, err = run(capsys, "train", "tool2vec", "--data", sample, "--out", tmp_path / "idx")
    assert code == 1 and "holds something that is not a toolscout model" in err
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    (unlabelled / "tools.jsonl").write_text((sample / "tools.jsonl").read_text())
    code, _, err = run(capsys, "eval", unlabelled, "--retriever", "bm25", "--quiet")
    assert code == 1 and "unlabelled: no queries.jsonl; set skipped" in err


def test_max_queries_help_warns_that_the_first_n_may_not_represent_the_split(capsys, shared_data):
    """--max-queries takes the first N; its help's example is checked against the data it names."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("the first N of the split in file order (the same ones every run), which may not represent the split: "
            "sealtools' first 150 test queries all need one tool, while 78% of its test split needs several") in help_text
    from toolscout.benchmark_sets import load_benchmark

    test = load_benchmark(shared_data / "sealtools").split("test")
    assert all(len(q.labels) == 1 for q in test[:150])
    assert round(100 * sum(len(q.labels) > 1 for q in test) / len(test)) == 78


def test_eval_times_each_system_with_a_cold_query_cache(encoder):
    """Systems sharing an encoder (loaded once) each encode their own tasks: the dense run after the hybrid
    one took the hybrid's cached vectors, and its latency was ~50x too good."""
    from toolscout.cli.evaluate import _factory
    from toolscout.eval import evaluate

    cache = encoder.query_cache
    for name in ("hybrid", "dense"):
        hits, misses = cache.hits, cache.misses
        factory = _factory(name, {"encoder": encoder, "intents": None}, None)
        report = evaluate([EVAL_SETS / "alpha", EVAL_SETS / "beta"], factory, k=2, name=name, progress=False)
        # per set: the neutral warm-up task, then each test task, every one through the encoder
        assert (cache.hits - hits, cache.misses - misses) == (0, 2 + report.n_queries), name


def test_eval_refuses_too_few_bootstrap_resamples_for_a_95_interval(capsys):
    """--bootstrap 1 printed a "95% CI" from one resample, which did not even hold the estimate."""
    for count in ("1", "39"):
        with pytest.raises(SystemExit):  # before any set is evaluated
            run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--retriever", "bm25", "--bootstrap", count)
        err = capsys.readouterr().err
        assert ("argument --bootstrap: a 95% interval needs at least 40 resamples (0: no comparison), "
                f"got {count}") in err


def test_eval_says_when_the_llm_reranker_failed_and_on_how_many_queries(capsys, tmp_path):
    """Every call to the LLM failing (HTTP 500) left "bm25+llm@20" in the table and the JSON with the first
    stage's order, the failure only as raw Python UserWarnings on stderr. Now: counted over the timed
    queries, under the table, on stderr as one clear line with the first error, in the JSON's warnings.
    alpha's first 4 queries: a3 gets no BM25 candidate (nothing to rerank, nothing failed), the others 1-3."""
    from fakellm import FakeLLM, Reply, mentions

    settings, out_json = tmp_path / "llm.yaml", tmp_path / "r.json"
    with FakeLLM(responder=lambda request: Reply(status=500)) as llm:
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--rerank", f"llm:{settings}",
                             "--max-queries", "4", "--json", out_json, "--quiet")
    assert code == 0, err
    said = "bm25+llm@20: LLM reranker failed on 3 of 4 queries (they kept the first stage's order)"
    assert out.rstrip().endswith(f"warning: {said}")  # under the table
    line = next(line for line in err.splitlines() if said in line)
    assert line.startswith(f"warning: {said}; first error: POST {llm.url}/chat/completions → HTTP 500")
    assert "UserWarning" not in err and "pipeline.py" not in err  # no raw Python warning, no source line
    data = json.loads(out_json.read_text())
    assert line.removeprefix("warning: ") in data["warnings"]
    assert data["degraded"]["LLM reranker"]["queries"] == 3 and data["degraded"]["LLM reranker"]["of"] == 4

    plain = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "true"}}]})  # no logprobs
    with FakeLLM(responder=lambda request: Reply(body=plain)) as llm:  # only the query about flights and hotels fails
        llm.script(*[Reply(status=500)] * 3, when=mentions("flights to Rome"))
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--rerank", f"llm:{settings}",
                             "--max-queries", "4", "--json", out_json, "--quiet")
    assert code == 0, err
    assert "warning: bm25+llm@20: LLM reranker failed on 1 of 4 queries (they kept the first stage's order)" in out
    # what else the system warned while ranking (this endpoint gives no log-probabilities), once, as a line
    assert err.count("warning: bm25+llm@20: LLM reranker: the endpoint") == 1 and "UserWarning" not in err
    assert json.loads(out_json.read_text())["degraded"]["LLM reranker"]["queries"] == 1


def test_search_with_a_failing_llm_reranker_keeps_the_first_stages_hits_and_says_so_in_one_line(capsys, tmp_path):
    """An LLM reranker that failed left `search` with scores -1, -2, -3 and no probabilities, though the
    warning said the query kept its first-stage order, and the warning came as a raw Python one (file, line
    of source). Now the hits are those of the same index without the reranker, scores and probabilities
    alike, and stderr has one `warning: LLM reranker: ...` line. The answer itself said nothing of it (trial8
    #5): now `--json` has `degraded` {stage, reason} and the table a note under it."""
    from fakellm import FakeLLM, Reply

    catalog, task = CATALOGS / "apibank_sample", "check my account balance"
    code, _, err = run(capsys, "index", catalog, "--out", tmp_path / "plain", "--quiet")
    assert code == 0, err
    settings = tmp_path / "llm.yaml"
    with FakeLLM(responder=lambda request: Reply(status=500)) as llm:
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, _, err = run(capsys, "index", catalog, "--out", tmp_path / "llm", "--rerank", f"llm:{settings}", "--quiet")
        assert code == 0, err
        # a reranker shallower than the first stage's calibration reads (10): its probabilities still are those
        code, _, err = run(capsys, "index", catalog, "--out", tmp_path / "llm5", "--rerank", f"llm:{settings}",
                           "--rerank-depth", "5", "--quiet")
        assert code == 0, err
        code, out5, _ = run(capsys, "search", tmp_path / "llm5", task, "-k", "3", "--json")
        code, out, err = run(capsys, "search", tmp_path / "llm", task, "-k", "3", "--json")
        _, table, _ = run(capsys, "search", tmp_path / "llm", task, "-k", "3")
    assert code == 0, err
    reranked = [(h["id"], h["score"], h.get("probability")) for h in json.loads(out)["hits"]]
    degraded = json.loads(out)["degraded"]
    _, out, _ = run(capsys, "search", tmp_path / "plain", task, "-k", "3", "--json")
    plain = [(h["id"], h["score"], h.get("probability")) for h in json.loads(out)["hits"]]
    assert reranked == plain and all(p is not None for _, _, p in plain) and plain[0][1] > 0
    assert [(h["id"], h["score"], h.get("probability")) for h in json.loads(out5)["hits"]] == plain
    assert err.startswith("warning: LLM reranker: ") and "HTTP 500" in err and len(err.splitlines()) == 1
    assert "DegradedResults" not in err and ".py:" not in err
    # the answer itself says so, per task (the warning alone was on stderr): --json and the table
    assert "degraded" not in json.loads(out)  # the index without a reranker: nothing to say
    # a local user: the error in full (`detail`), beside the reason callers of a server read
    assert degraded["stage"] == "LLM reranker" and f"POST {llm.url}/chat/completions → HTTP 500" in degraded["detail"]
    assert degraded["detail"].endswith(f"(tool {plain[0][0]!r})")  # the first candidate's pair failed first
    note = next(line for line in table.splitlines() if line.startswith("note:"))
    assert note.startswith("note: the LLM reranker could not rank this task, so these are the first stage's hits: POST")


def test_index_with_an_llm_reranker_tries_its_endpoint_once_and_warns_when_it_fails(capsys, tmp_path):
    """`index --rerank llm:CONFIG` wrote an index whose reranker could not reach its LLM without a word, and
    every search then paid for it. Now one request, shaped as a search's, is sent: a failure is a warning
    naming the URL and the reason (the index is still written), an answer passes silently."""
    import socket

    from fakellm import FakeLLM, Reply

    catalog, settings = CATALOGS / "apibank_sample", tmp_path / "llm.yaml"
    with socket.socket() as sock:  # bound, never listening: connections refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        settings.write_text(f"base_url: {url}\nmodel: m\nmax_retries: 0\n")
        code, _, err = run(capsys, "index", catalog, "--out", tmp_path / "down", "--retriever", "bm25",
                           "--rerank", f"llm:{settings}", "--quiet")
    assert code == 0 and (tmp_path / "down").is_dir()
    warning = next(line for line in err.splitlines() if line.startswith("warning: "))
    assert f"--rerank llm:{settings}" in warning and f"{url}/chat/completions" in warning
    assert "cannot reach the server" in warning
    with FakeLLM(responder=lambda request: Reply("true")) as llm:
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, _, err = run(capsys, "index", catalog, "--out", tmp_path / "up", "--retriever", "bm25",
                           "--rerank", f"llm:{settings}", "--quiet")
        assert code == 0 and "warning" not in err and llm.calls == 1
        run(capsys, "search", tmp_path / "up", "check my account balance", "-k", "1")
        probe, searched = llm.requests[0], llm.requests[1]
    parameters = [{k: v for k, v in request.items() if k not in ("messages", "_headers")}
                  for request in (probe, searched)]
    assert parameters[0] == parameters[1]  # the searches' own parameters (max_tokens among them)



def first_word_judgement(text: str):
    """An LLM reranker's reply to the prompt `text`: P(true) high when the tool's documentation shares the task's
    first word, low otherwise (as log-probabilities of true and false)."""
    from fakellm import Reply

    task, document = text.split("Tool documentation:", 1)
    yes = task.split("Task:", 1)[1].split()[0].lower() in document.lower()
    return Reply("true" if yes else "false", logprobs=[{"token": "true" if yes else "false", "logprob": -0.1,
                 "bytes": None, "top_logprobs": [{"token": "true", "logprob": -0.1 if yes else -2.5},
                                                 {"token": "false", "logprob": -2.5 if yes else -0.1}]}])


def test_eval_json_has_the_categories_and_every_querys_scores(capsys, tmp_path):
    """--per-category showed categories in the table only, and no per-query scores were written: a reader
    could neither slice the results nor redo the comparison. Checked against the metrics worked by hand on
    the written rankings, the table's category rows, and the bootstrap's difference redone from the rows."""
    from fakellm import FakeLLM, message_text

    def judge(request):
        return first_word_judgement(message_text(request))

    settings, out_json = tmp_path / "llm.yaml", tmp_path / "r.json"
    with FakeLLM(responder=judge) as llm:
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", EVAL_SETS / "beta", "--retriever", "bm25",
                             "--rerank", f"llm:{settings}", "--with-first-stage", "--per-category", "-k", "5",
                             "--json", out_json, "--quiet", "--bootstrap", "200")
    assert code == 0, err
    data = json.loads(out_json.read_text())
    first = data["systems"]["bm25"]
    for name in ("alpha", "beta"):
        rows = first["per_query"][name]
        written = [json.loads(line) for line in (EVAL_SETS / name / "queries.jsonl").open()]
        labelled = [q for q in written if q["labels"] and q.get("split", "test") == "test"]
        assert [(r["id"], r["query"], r["labels"]) for r in rows] == \
            [(q["id"], q["query"], q["labels"]) for q in labelled]
        for row in rows:
            for key, value in points_by_hand(row["ranked"], row["labels"], k=5).items():
                assert row[key] == pytest.approx(value, abs=1e-9), (row["id"], key)
        for category, cell in first["per_category"][name].items():  # the table's rows, in the JSON
            mine = [r for r in rows if r["category"] == category]
            assert cell["queries"] == len(mine)
            assert cell["ndcg@5"] == pytest.approx(sum(r["ndcg@5"] for r in mine) / len(mine))
            assert f"  {category}" in out and f"{cell['ndcg@5']:.2f}" in out
    # the comparison, redone from the rows: the mean of the paired differences over both sets
    second = data["systems"]["bm25+llm@20"]["per_query"]
    diffs = [b["ndcg@5"] - a["ndcg@5"] for name in ("alpha", "beta")
             for a, b in zip(first["per_query"][name], second[name]) if a["id"] == b["id"]]
    assert len(diffs) == 16 and any(diffs)  # the reranker moved some queries
    assert data["comparisons"][0]["diff"] == pytest.approx(sum(diffs) / len(diffs))


def test_eval_flags_a_comparison_whose_reranker_fell_back_and_compares_the_fully_reranked_queries(capsys, tmp_path):
    """An LLM reranker that failed on some queries left them with the first stage's ranking, yet the paired
    comparison "bm25+llm@20 vs bm25" was printed as if it compared the two systems on every query (trial8 #13).
    Now the line says how many queries fell back, and a second line (and the JSON's `fully_ranked`) compares
    the others only: checked against the mean difference redone by hand from the per-query rows."""
    from fakellm import FakeLLM, Reply, message_text

    def judge(request):  # fails on the query about flights to Rome; elsewhere true when the tool shares its first word
        text = message_text(request)
        if "flights to Rome" in text:
            return Reply(status=500)
        return first_word_judgement(text)

    settings, out_json = tmp_path / "llm.yaml", tmp_path / "r.json"
    with FakeLLM(responder=judge) as llm:
        settings.write_text(f"base_url: {llm.url}\nmodel: m\nmax_retries: 0\n")
        code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", EVAL_SETS / "beta", "--retriever", "bm25",
                             "--rerank", f"llm:{settings}", "--with-first-stage", "-k", "5", "--json", out_json,
                             "--quiet", "--bootstrap", "200")
    assert code == 0, err
    data = json.loads(out_json.read_text())
    first, second = (data["systems"][name]["per_query"] for name in ("bm25", "bm25+llm@20"))
    pairs = [(a, b) for name in ("alpha", "beta") for a, b in zip(first[name], second[name])]
    assert [b["id"] for _, b in pairs if b["degraded"]] == ["a2"] and not any(a["degraded"] for a, _ in pairs)
    kept = [b["ndcg@5"] - a["ndcg@5"] for a, b in pairs if "flights to Rome" not in a["query"]]
    comparison = data["comparisons"][0]
    assert comparison["degraded_queries"] == 1 and comparison["n_queries"] == 16
    assert comparison["fully_ranked"]["n_queries"] == 15 == len(kept)
    assert comparison["fully_ranked"]["diff"] == pytest.approx(sum(kept) / len(kept))
    line = next(line for line in out.splitlines() if line.startswith("bm25+llm@20 vs bm25: "))
    assert line.endswith("pooled over 16 queries of 2 sets; 1 of them fell back to the first stage (a stage "
                         "failed), so B is partly A there")
    fully = next(line for line in out.splitlines()
                 if line.startswith("bm25+llm@20 vs bm25, fully ranked queries only: "))
    assert fully.endswith("pooled over 15 queries of 2 sets") and f"{comparison['fully_ranked']['diff']:+.2f}" in fully


def points_by_hand(ranked, gold, k):
    """nDCG (binary gains), recall and MRR at k of one ranking, in points, from their textbook definitions."""
    import math

    top = ranked[:k]
    dcg = sum(1 / math.log2(rank + 1) for rank, tool in enumerate(top, 1) if tool in gold)
    ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(k, len(gold)) + 1))
    first = next((rank for rank, tool in enumerate(top, 1) if tool in gold), None)
    return {f"ndcg@{k}": 100 * dcg / ideal, f"recall@{k}": 100 * len(set(top) & set(gold)) / len(set(gold)),
            f"mrr@{k}": 100 / first if first else 0.0}


def test_eval_takes_retriever_settings_and_names_two_settings_of_one_retriever_apart(capsys, tmp_path):
    """eval had no -o (the configuration `index -o` builds could not be measured), and the same --retriever
    twice was merged into one system, silently."""
    from toolscout import ToolScout
    from toolscout.benchmark_sets import load_benchmark

    out_json = tmp_path / "r.json"
    code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "-o", "k1=0.05", "-o", "b=0",
                         "--retriever", "bm25", "--json", out_json, "--quiet", "--bootstrap", "0", "-k", "5")
    assert code == 0, err
    systems = json.loads(out_json.read_text())["systems"]
    assert list(systems) == ["bm25[k1=0.05,b=0]", "bm25"] and "bm25[k1=0.05,b=0]" in out  # (not read as markup)
    bench = load_benchmark(EVAL_SETS / "alpha")
    for name, settings in (("bm25[k1=0.05,b=0]", {"k1": 0.05, "b": 0}), ("bm25", {})):  # as `index -o` builds it
        scout = ToolScout.from_tools(bench.tools, retriever="bm25", **settings)
        rows = systems[name]["per_query"]["alpha"]
        assert [r["ranked"] for r in rows] == [list(scout.retrieve([r["query"]], 5).ids[0]) for r in rows], name
    assert systems["bm25[k1=0.05,b=0]"]["per_query"] != systems["bm25"]["per_query"]  # the settings told

    for argv, said in (
            (["--retriever", "bm25", "--retriever", "bm25"], "--retriever bm25 is given twice (as bm25 too)"),
            (["--retriever", "bm25", "-o", "b=0", "--retriever", "bm25", "-o", "b=0.0"],
             "--retriever bm25[b=0.0] is given twice (as bm25[b=0] too)"),
            (["-o", "b=0", "--retriever", "bm25"], "-o b=0: give it after the --retriever it sets"),
            (["--retriever", "bm25", "--retriever", "bm25", "-o", "bogus=1"],
             "--retriever bm25[bogus=1]: the bm25 retriever: unknown setting(s) 'bogus'")):
        code, _, err = run(capsys, "eval", EVAL_SETS / "alpha", *argv, "--json", out_json, "--quiet")
        assert code == 1 and f"toolscout eval: error: {said}" in err, err


def test_eval_interrupted_reports_the_systems_that_finished(capsys, tmp_path, monkeypatch):
    """Ctrl-C during the second of two systems lost the first one's results: nothing printed, no --json; then
    the --json of the one that finished had the one-system layout, not the `systems` the command asked for."""
    import toolscout.eval

    evaluate = toolscout.eval.evaluate

    def interrupted_at_the_second(sets, factory, **options):
        if options["name"] == "bm25[b=0]":
            raise KeyboardInterrupt  # what Python raises on Ctrl-C
        return evaluate(sets, factory, **options)

    monkeypatch.setattr(toolscout.eval, "evaluate", interrupted_at_the_second)
    out_json = tmp_path / "r.json"
    code, out, err = run(capsys, "eval", EVAL_SETS / "alpha", "--retriever", "bm25", "--retriever", "bm25", "-o", "b=0",
                         "--json", out_json, "--quiet")
    assert code == 130 and err.rstrip().endswith("toolscout eval: interrupted")
    assert "interrupted; reporting the 1 system that finished" in err and "toolscout eval (bm25)" in out
    data = json.loads(out_json.read_text())
    assert list(data) == ["systems", "comparisons", "interrupted"] and list(data["systems"]) == ["bm25"]
    assert data["systems"]["bm25"]["system"] == "bm25" and data["systems"]["bm25"]["sets"]["alpha"]["queries"] == 8
    assert data["comparisons"] == [] and data["interrupted"] == (
        "stopped (Ctrl-C) before every system was evaluated; these are the ones that finished (not evaluated: "
        "bm25[b=0])")


def test_migrate_search_on_a_table_with_no_tenant_says_so(capsys):
    """`migrate --search` told "(0 tenants: )" for a table no catalog was indexed into yet."""
    from toolscout.cli.pg_store import tell_search_switch
    from toolscout.postgres import SearchSwitch

    hybrid = {"name": "hybrid", "components": [{"name": "bm25"}, {"name": "dense"}],
              "settings": {"fusion": "max", "weights": [1.0, 3.0]}}
    tell_search_switch("tools", SearchSwitch({"name": "dense"}, hybrid, []))
    err = capsys.readouterr().err
    assert ("first stage of index table 'tools': dense -> hybrid of bm25 + dense (fusion=max, weights=[1.0, 3.0]), "
            "for every tenant of the table (no tenant has a catalog yet), served by") in err
    tell_search_switch("tools", SearchSwitch({"name": "dense"}, hybrid, ["acme"]))
    assert "for every tenant of the table (1 tenant: acme), served by" in capsys.readouterr().err


def test_index_reads_a_spec_by_url_and_says_what_to_do_with_a_location_it_cannot_read(capsys, tmp_path):
    from servers import DocumentHost

    spec = {"openapi": "3.0.0", "info": {"title": "shop"},
            "paths": {"/items": {"get": {"operationId": "listItems", "summary": "List the items"}}}}
    with DocumentHost({"/openapi.json": ("application/json", json.dumps(spec)),
                       "/docs": ("text/html", "<html><body>docs</body></html>"),
                       "/spec": ("application/json", json.dumps(spec))}) as host:
        code, _, err = run(capsys, "index", f"{host.url}/openapi.json", "--out", tmp_path / "a", "--retriever", "bm25")
        assert code == 0 and f"{host.url}/openapi.json: 1 tools (openapi)" in err, err
        # a path without a document's suffix is read as a document when a format is given
        code, _, err = run(capsys, "index", f"{host.url}/spec", "--format", "openapi", "--out", tmp_path / "b",
                           "--retriever", "bm25")
        assert code == 0 and "1 tools (openapi)" in err, err
        code, _, err = run(capsys, "index", f"{host.url}/docs", "--format", "openapi", "--out", tmp_path / "c")
        assert code != 0 and f"{host.url}/docs: the server answered with an HTML page" in err, err
        code, _, err = run(capsys, "index", f"{host.url}/gone.yaml", "--out", tmp_path / "d")
        assert code != 0 and f"{host.url}/gone.yaml: the server answered HTTP 404" in err, err
        assert "Error:" not in err and "HTTPError" not in err
        # not a document's path, no format: an MCP endpoint, and when it is not one, the way to read it as a spec
        code, _, err = run(capsys, "index", f"{host.url}/spec", "--out", tmp_path / "e")
        assert code != 0 and "could not list the MCP server's tools" in err and "--format openapi" in err, err
    code, _, err = run(capsys, "index", "htp://127.0.0.1:9/x.json", "--out", tmp_path / "f")
    assert code != 0 and "unsupported URL scheme 'htp' in 'htp://127.0.0.1:9/x.json'" in err, err

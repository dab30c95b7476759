"""A pipeline's saved configuration (`toolscout.spec`) and the one factory that builds every deployment's
pipeline from it (`ToolScout.build`); what the PostgreSQL store can serve (`pg_pipeline.unservable`), and the
pipeline a table indexed before specs were recorded is served with (`pg_pipeline.table_spec`)."""

import json

import pytest

from toolscout import ToolScout
from toolscout.defaults import DEFAULT_INTENTS
from toolscout.pg_pipeline import table_spec, unservable
from toolscout.retrievers.base import load_retriever
from toolscout.retrievers.dense import encoding_of
from toolscout.spec import PipelineSpec, differences
from toolscout.store.pg_config import IndexConfig
from toolscout.tool import TextView

QUERIES = ["what is the weather tomorrow in Paris", "book a flight to Rome, then reserve a hotel there",
           "send an email to my boss", "convert 100 dollars to euros"]


def ranked(scout):
    return [[(h.tool.id, round(h.score, 6)) for h in hits] for hits in scout.search(QUERIES, k=5)]


def test_save_records_the_spec_and_the_factory_builds_the_same_pipeline_from_it(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools, encoder=encoder, weights=[2, 1], fusion="rrf", rrf_k=10, depth=50,
                                 component_options={"bm25": {"k1": 1.2, "b": 0.5}}, intents=None)
    scout.save(tmp_path / "idx")
    config = json.loads(next((tmp_path / "idx").glob("v*/config.json")).read_text())
    spec = PipelineSpec.from_dict(config["pipeline"])
    assert spec == scout.spec and spec.intents is None and spec.reranker is None
    hybrid, (bm25, dense) = spec.retriever, spec.retriever["components"]
    assert hybrid["settings"] == {"weights": [2.0, 1.0], "fusion": "rrf", "rrf_k": 10, "depth": 50}
    assert bm25["settings"]["params"] == {"k1": 1.2, "b": 0.5}
    assert dense["settings"]["model"] == encoder.name
    assert "store_kind" not in dense["settings"]  # where vectors are kept is the backend's, not the spec's
    # the factory, its leaves loaded from the directory's files: the same ranking as the pipeline saved
    folder = next((tmp_path / "idx").glob("v*"))
    built = ToolScout.build(spec, scout.tools, lambda _node, where: load_retriever(folder / "retriever" / where))
    assert ranked(built) == ranked(scout) == ranked(ToolScout.load(tmp_path / "idx"))
    assert (built.retriever.fusion, built.retriever.rrf_k) == ("rrf", 10)
    assert built.retriever.components[0].params == {"k1": 1.2, "b": 0.5}


def test_a_directory_saved_before_specs_is_described_by_its_files(tools, encoder, tmp_path):
    scout = ToolScout.from_tools(tools, encoder=encoder, weights=[1, 1])
    scout.save(tmp_path / "idx")
    config_file = next((tmp_path / "idx").glob("v*/config.json"))
    config = json.loads(config_file.read_text())
    config.pop("pipeline")  # what directories saved before this version look like
    config_file.write_text(json.dumps(config))
    assert PipelineSpec.read(config_file.parent, config) == scout.spec
    assert ranked(ToolScout.load(tmp_path / "idx")) == ranked(scout)


def test_what_postgresql_serves_and_what_it_refuses(tools, encoder, tmp_path):
    assert unservable(ToolScout.from_tools([], encoder=encoder).spec) == []
    assert unservable(ToolScout.from_tools([], retriever="dense", encoder=encoder).spec) == []
    t2v = ToolScout.from_tools([], retriever="hybrid", encoder=encoder, components=["bm25", "tool2vec"]).spec
    assert unservable(t2v) == [
        "retriever 'tool2vec' (component 1 of the hybrid): its index is not rows of the table (vectors learned from "
        "usage, a classifier head or its own tool tower)",
        "0 dense retrievers: a table holds one column of dense vectors, so its pipeline needs exactly one dense "
        "retriever"]
    two = ToolScout.from_tools([], encoder=encoder, components=["dense", "bm25", "dense"]).spec
    assert unservable(two) == ["2 dense retrievers: a table holds one column of dense vectors, so its pipeline "
                               "needs exactly one dense retriever"]
    gone = tmp_path / "gone"
    reranked = PipelineSpec(two.retriever["components"][0], reranker={"reranker": "cross", "model": str(gone)})
    assert unservable(reranked) == [f"reranker 'cross': its model directory {gone} is not there, and every replica "
                                    "loads it from that path"]
    llm = PipelineSpec(reranked.retriever, reranker={"reranker": "llm", "settings": {"base_url": "http://x/v1"}})
    assert unservable(llm) == []


def test_a_table_indexed_before_specs_is_served_with_the_pipeline_its_servers_built(encoder):
    view = TextView()
    legacy = IndexConfig(encoder.name, view.to_dict(), "hybrid", 0.3, DEFAULT_INTENTS, encoding=encoding_of(encoder))
    default = ToolScout.from_tools([], encoder=encoder, summary_weight=0.3).spec
    assert table_spec(legacy).retriever == default.retriever and table_spec(legacy).intents == DEFAULT_INTENTS
    dense = IndexConfig(encoder.name, view.to_dict(), "dense", 0.3, None, encoding=encoding_of(encoder))
    assert table_spec(dense).retriever == ToolScout.from_tools([], retriever="dense", encoder=encoder,
                                                               summary_weight=0.3).spec.retriever
    recorded = IndexConfig("m", {}, "dense", pipeline=default.to_dict())
    assert table_spec(recorded) == default


def test_differences_name_each_setting():
    there = PipelineSpec({"name": "hybrid", "settings": {"weights": [1.0, 3.0], "fusion": "max"},
                          "components": [{"name": "bm25", "settings": {"params": {"k1": 1.5}}}]}, {"merge": "max"})
    here = PipelineSpec({"name": "hybrid", "settings": {"weights": [1.0, 1.0], "fusion": "max"},
                         "components": [{"name": "bm25", "settings": {"params": {"k1": 1.2}}}]}, None)
    assert differences(there.to_dict(), here.to_dict()) == [
        "intents: {'merge': 'max'} there, None here",
        "retriever.components[0].settings.params.k1: 1.5 there, 1.2 here",
        "retriever.settings.weights: [1.0, 3.0] there, [1.0, 1.0] here"]


@pytest.mark.parametrize("flags", [[], ["-o", "weights=[2,1]", "-o", "fusion=score", "--no-split"]])
def test_cli_index_builds_the_pipeline_its_flags_describe(flags, tools, tmp_path, capsys):
    from toolscout.cli import main

    catalog = tmp_path / "tools.json"
    catalog.write_text(json.dumps([{"type": "function", "function": {"name": t.name, "description": t.description}}
                                   for t in tools]))
    assert main(["index", str(catalog), "--out", str(tmp_path / "idx"), *flags]) == 0
    spec = ToolScout.load(tmp_path / "idx").spec
    if flags:
        assert spec.retriever["settings"]["weights"] == [2.0, 1.0] and spec.retriever["settings"]["fusion"] == "score"
        assert spec.intents is None
    else:
        assert spec.retriever["settings"]["weights"] == [1.0, 3.0] and spec.intents is not None
    assert main(["index", str(catalog), "--out", str(tmp_path / "bad"), "-o", "weights=[1]"]) == 1
    assert "1 weights for 2 components" in capsys.readouterr().err

"""ToolRefiner: leave-one-out candidates, a tiny real training run, reload, and the pipeline second stage."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from toolscout.artifacts import ArtifactError
from toolscout.benchmark_sets import Query
from toolscout.cli import main
from toolscout.encoders import Encoder
from toolscout.pipeline import ToolScout
from toolscout.rerank.base import load_reranker
from toolscout.rerank.refiner import ToolRefinerReranker, build_refiner_net, load_transformer
from toolscout.results import Results
from toolscout.tool import TextView, Tool
from toolscout.train.data import TrainingData, load_training_data
from toolscout.train.loop import TrainConfig
from toolscout.train.refiner import CandidateBuilder, fit_refiner

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


# slow: trains; trained models encode with torch (conftest)
pytestmark = [pytest.mark.usefixtures("torch_encoders"), pytest.mark.slow]


@pytest.fixture(scope="module")
def sample_data() -> TrainingData:
    return load_training_data([SAMPLE], validation_fraction=0.2)


def test_leave_one_out_removes_the_query_from_its_gold_tool_vectors():
    tools = {f"s::t{i}": Tool(f"s::t{i}", f"tool{i}", f"does thing number {i}") for i in range(4)}
    train = [Query("a", "first request", ("s::t0",)), Query("b", "second request", ("s::t0",)),
             Query("c", "third request", ("s::t1",))]
    data = TrainingData(tools, train, [], ["s"])
    builder = CandidateBuilder(data, "tool2vec", None, None, TextView(), prior=1.0, depth=4, progress=False)
    e = builder.train_vectors
    d = builder.descriptions
    cands = builder.build(train, e, leave_one_out=True)

    def unit(v):
        return v / np.linalg.norm(v)

    # query a: t0's vector without a is unit(e_b + d_0) (one other usage query plus the description prior)
    row = cands[0].ids.index("s::t0")
    np.testing.assert_allclose(cands[0].vectors[row], unit(e[1] + d[0]), atol=1e-5)
    # query c is t1's only usage: without it, t1 is its description vector
    row = cands[2].ids.index("s::t1")
    np.testing.assert_allclose(cands[2].vectors[row], d[1], atol=1e-6)
    # a non-gold tool keeps its full Tool2Vec vector: t1 for query a is unit(e_c + d_1)
    np.testing.assert_allclose(cands[0].vectors[cands[0].ids.index("s::t1")], unit(e[2] + d[1]), atol=1e-5)
    # the ranking uses the same vectors: candidates are sorted by cosine to the query
    sims = cands[0].vectors @ e[0]
    assert list(sims) == sorted(sims, reverse=True)
    assert cands[0].labels.tolist() == [1.0 if t == "s::t0" else 0.0 for t in cands[0].ids]
    # without leave-one-out the gold vector contains the query itself
    plain = builder.build(train, e, leave_one_out=False)
    np.testing.assert_allclose(plain[2].vectors[plain[2].ids.index("s::t1")], unit(e[2] + d[1]), atol=1e-5)


def test_net_starts_as_the_first_stage_and_padding_does_not_change_scores():
    transformer, tokenizer = load_transformer(str(Encoder.load(None).path))
    torch.manual_seed(0)
    net = build_refiner_net(transformer, 384, 16).eval()
    tokens = tokenizer(["book a table"], return_tensors="pt")
    vectors = torch.randn(1, 3, 384)
    first_stage = torch.tensor([[0.9, 0.5, 0.7]])
    with torch.inference_mode():
        logits = net(tokens["input_ids"], tokens["attention_mask"], vectors, torch.ones(1, 3, dtype=torch.long),
                     first_stage)
    # untrained: logit = 2 · z - 2, z the scores standardised over the list (mean 0.7, population sd 0.1633)
    z = (first_stage - 0.7) / first_stage.std(unbiased=False)
    torch.testing.assert_close(logits, 2.0 * z - 2.0, atol=1e-4, rtol=1e-4)
    torch.nn.init.normal_(net.head.weight, std=0.5)  # as if trained: the transformer's states now count
    with torch.inference_mode():
        logits = net(tokens["input_ids"], tokens["attention_mask"], vectors, torch.ones(1, 3, dtype=torch.long),
                     first_stage)
        padded = net(tokens["input_ids"], tokens["attention_mask"], torch.cat([vectors, torch.randn(1, 2, 384)], 1),
                     torch.tensor([[1, 1, 1, 0, 0]]), torch.tensor([[0.9, 0.5, 0.7, 5.0, -3.0]]))
    assert logits.shape == (1, 3)
    assert not torch.allclose(logits, 2.0 * z - 2.0, atol=1e-3)
    torch.testing.assert_close(padded[:, :3], logits, atol=1e-5, rtol=1e-4)  # masked slots are invisible


@pytest.fixture(scope="module")
def trained(sample_data, tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("refiner") / "model"
    config = TrainConfig(batch_size=4, lr=1e-4, epochs=2, warmup_ratio=0.0, progress=False)
    summary = fit_refiner(sample_data, out, model=tiny_model, config=config, resume=False, depth=8,
                          max_query_length=24)
    return out, summary


def test_training_lowers_the_loss_and_reloads_to_identical_scores(trained, sample_data):
    out, summary = trained
    losses = [h["loss"] for h in summary.history if "loss" in h]
    assert summary.steps == 10 and len(losses) >= 2 and losses[-1] < losses[0], summary.history
    assert summary.data["train_candidate_recall"] > 0 and summary.best_validation is not None
    config = json.loads((out / (out / "CURRENT").read_text().strip() / "config.json").read_text())
    assert config["method"] == "refiner" and config["depth"] == 8 and config["vectors"] == "tool2vec"

    a, b = load_reranker(out), ToolRefinerReranker(str(out))
    assert isinstance(a, ToolRefinerReranker) and a.depth == 8
    tools = sample_data.tools
    ids = list(tools)[:6]
    candidates = Results.from_lists([ids, ids[::-1]], [[1.0] * 6, [1.0] * 6])
    queries = ["check my appointment", "what is the weather"]
    with warnings.catch_warnings():  # no first stage: the refiner makes the Tool2Vec vectors it carries
        warnings.simplefilter("error")
        ra, rb = a.rerank(queries, candidates, tools), b.rerank(queries, candidates, tools)
    for (ia, sa), (ib, sb), given in zip(ra, rb, candidates.ids):
        assert sorted(ia) == sorted(given) and len(ia) == len(given)  # exactly the candidates, reordered
        assert list(ia) == list(ib)
        np.testing.assert_allclose(sa, sb, atol=1e-6)
        assert np.all((sa >= 0) & (sa <= 1)) and list(sa) == sorted(sa, reverse=True)


def test_pipeline_with_refiner_saves_and_loads_as_one_directory(trained, sample_data, tmp_path, tiny_model):
    out, _ = trained
    tools = list(sample_data.tools.values())
    scout = ToolScout.from_tools(tools, retriever="dense", model=tiny_model, reranker=out)
    hits = scout.search("set an alarm for 7am", k=3)
    assert len(hits) == 3 and scout.reranker.name == "refiner"
    plain = ToolScout.from_tools(tools, retriever="dense", model=tiny_model).retrieve(["set an alarm for 7am"], k=8)
    assert {h.tool.id for h in hits} <= set(plain.ids[0])  # the reranker only reorders the first stage's top 8
    scout.save(tmp_path / "p")
    again = ToolScout.load(tmp_path / "p")
    assert again.reranker is not None and again.reranker.depth == 8
    reloaded = again.search("set an alarm for 7am", k=3)
    assert [h.tool.id for h in reloaded] == [h.tool.id for h in hits]
    # the saved index records an exact (float32) encoding: ONNX after loading, torch here while training
    assert [h.score for h in reloaded] == pytest.approx([h.score for h in hits], abs=1e-4)


def test_wrong_model_dir_is_a_clear_error(tmp_path, trained):
    from toolscout.artifacts import ArtifactError

    with pytest.raises(ArtifactError, match="not a ToolRefiner model directory"):
        ToolRefinerReranker(str(tmp_path))
    with pytest.raises(ValueError, match="vectors must be one of"):
        ToolRefinerReranker(str(trained[0]), vectors="bogus")


def test_cli_eval_with_rerank_compares_against_the_first_stage(trained, tmp_path, capsys):
    # (`toolscout train refiner` dispatches through the same TRAINERS table as `train cross`, tested there)
    report = tmp_path / "eval.json"
    code = main(["eval", str(SAMPLE), "--split", "train", "--retriever", "dense", "--rerank", str(trained[0]),
                 "--rerank-depth", "6", "--with-first-stage", "--json", str(report), "--quiet", "--bootstrap", "200"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert set(data["systems"]) == {"dense", "dense+refiner@6"}
    assert data["comparisons"][0]["b"] == "dense+refiner@6"
    # k=10 > depth 6, so the reranker reorders the first stage's top 10 (max(k, depth)): the same tools
    # are in the top 10, in another order — recall@10 cannot change, nDCG@10 may
    first, second = data["systems"]["dense"]["mean"], data["systems"]["dense+refiner@6"]["mean"]
    assert second["recall@10"] == pytest.approx(first["recall@10"], abs=1e-9)
    capsys.readouterr()
    assert main(["eval", str(SAMPLE), "--rerank-depth", "5", "--quiet"]) == 1
    assert "--rerank-depth and --rerank-option need --rerank" in capsys.readouterr().err


# --------------------------------------------------------------------- ToolRefiner + MLC (the paper's rows)

@pytest.fixture(scope="module")
def mlc_pipeline(sample_data, tmp_path_factory, tiny_model):
    """A Tool2Vec model, an MLC model, and a refiner trained on the MLC's candidates with the Tool2Vec
    model's vectors (so over the Tool2Vec model's encoder): each as small as training allows."""
    from toolscout.train.mlc import fit_mlc
    from toolscout.train.tool2vec import fit_tool2vec

    root = tmp_path_factory.mktemp("refiner-mlc")
    quick = TrainConfig(batch_size=4, max_steps=2, warmup_ratio=0.0, progress=False)
    fit_tool2vec(sample_data, root / "t2v", model=tiny_model, config=quick, priors=(1.0,))
    fit_mlc(sample_data, root / "mlc", model=tiny_model, config=quick, probe_epochs=2, max_seq_length=32,
            validate_at_start=False)
    fit_refiner(sample_data, root / "refiner", config=quick, resume=False, first_stage_model=str(root / "mlc"),
                tool2vec_model=str(root / "t2v"), depth=8, max_query_length=24)
    return root


def test_refiner_behind_mlc_reads_the_tool2vec_models_vectors(mlc_pipeline, sample_data, monkeypatch):
    from toolscout.retrievers.mlc import MLCRetriever
    from toolscout.retrievers.tool2vec import Tool2VecRetriever

    root = mlc_pipeline
    config = json.loads((root / "refiner" / (root / "refiner" / "CURRENT").read_text().strip() / "config.json").read_text())
    assert config["first_stage"] == "mlc" and config["vectors"] == "tool2vec"
    tools = list(sample_data.tools.values())
    scout = ToolScout.from_tools(tools, retriever="mlc", model=str(root / "mlc"), reranker=str(root / "refiner"))
    seen = []  # (candidate ids, the vectors the refiner read for them, the first stage it was given)
    read = scout.reranker.candidate_vectors

    def recording(ids, by_id, first_stage):
        vectors = read(ids, by_id, first_stage)
        seen.append((list(ids), vectors, first_stage))
        return vectors

    monkeypatch.setattr(scout.reranker, "candidate_vectors", recording)
    with warnings.catch_warnings():  # no "using description embeddings" fallback
        warnings.simplefilter("error")
        scout.retrieve(["set an alarm for 7am", "schedule an appointment with Dr. Smith"], k=5)
    tool2vec = Tool2VecRetriever(model=str(root / "t2v"))  # the oracle: the Tool2Vec model's own stored vectors
    tool2vec.index(tools)
    assert len(seen) == 2 and all(isinstance(first, MLCRetriever) for _ids, _v, first in seen)
    for ids, vectors, _first in seen:
        assert len(ids) == 8
        np.testing.assert_allclose(vectors, tool2vec.store.get(ids), atol=1e-5)
    # tools with training usage have usage vectors, not their descriptions
    used = [(tid, v) for ids, vectors, _first in seen for tid, v in zip(ids, vectors) if tid in scout.reranker.usage]
    assert used
    described = scout.reranker.description_vectors([sample_data.tools[tid] for tid, _v in used])
    assert all(float(v @ d) < 0.99 for (_tid, v), d in zip(used, described))


def test_mlc_training_candidates_leave_the_query_out_of_its_gold_tool2vec_vectors(mlc_pipeline, sample_data):
    root = mlc_pipeline
    builder = CandidateBuilder(sample_data, "mlc", str(root / "mlc"), None, TextView(), prior=1.0, depth=8,
                               progress=False)
    e, d = builder.train_vectors, builder.descriptions
    cands = builder.build(sample_data.train, e, leave_one_out=True)
    checked = 0
    for i, (q, c) in enumerate(zip(sample_data.train, cands)):
        for j, tid in enumerate(c.ids):
            users = [k for k, other in enumerate(sample_data.train) if tid in other.labels]
            row = builder.row[tid]
            others = [k for k in users if k != i]
            expected = e[others].sum(0) + d[row] if others else d[row]  # prior 1: one query's worth of description
            np.testing.assert_allclose(c.vectors[j], expected / np.linalg.norm(expected), atol=1e-5)
            checked += tid in q.labels and len(others) > 0
    assert checked > 10  # gold tools with other usage queries were checked, not only descriptions


def test_old_refiner_directories_load_and_say_when_they_fall_back(mlc_pipeline, sample_data, tmp_path):
    """A directory written before refiners carried their vectors (vectors 'first_stage', no usage table)."""
    from toolscout.retrievers.mlc import MLCRetriever
    from toolscout.retrievers.tool2vec import Tool2VecRetriever

    old = tmp_path / "old"
    shutil.copytree(mlc_pipeline / "refiner", old)
    version = old / (old / "CURRENT").read_text().strip()
    config = json.loads((version / "config.json").read_text())
    config.update(vectors="first_stage", first_stage="tool2vec")
    del config["prior"]
    (version / "config.json").write_text(json.dumps(config))
    (version / "usage.npz").unlink()
    refiner = ToolRefinerReranker(str(old))
    tools = sample_data.tools
    ids = list(tools)[:6]
    tool2vec = Tool2VecRetriever(model=str(mlc_pipeline / "t2v"))
    tool2vec.index(list(tools.values()))
    np.testing.assert_allclose(refiner.candidate_vectors(ids, tools, tool2vec), tool2vec.store.get(ids))
    mlc = MLCRetriever(model=str(mlc_pipeline / "mlc"))
    with pytest.warns(UserWarning, match="trained before refiners carried their Tool2Vec vectors"):
        refiner.candidate_vectors(ids, tools, mlc)
    with pytest.raises(ArtifactError, match="usage.npz: missing"):
        ToolRefinerReranker(str(old), vectors="tool2vec")



def test_a_first_stage_model_of_no_first_stage_names_every_method_that_fits(tmp_path):
    """-o first_stage_model=<a cross directory>: the message named only tool2vec directories, though an mlc
    (or toolclip) directory is taken too, the first stage following it."""
    from toolscout.artifacts import write_artifact
    from toolscout.models import model_base
    from toolscout.train.refiner import first_stage_of, tool2vec_source

    cross = tmp_path / "cross"
    with write_artifact(cross, model_base("cross")):
        pass
    with pytest.raises(ValueError) as refused:
        tool2vec_source(first_stage_of(None, str(cross)), str(cross), None)
    assert str(refused.value) == (f"-o first_stage_model={cross}: is a 'cross' model; it should be a `toolscout "
                                  "train tool2vec` directory, or that of another first stage: `train mlc`, `train "
                                  "toolclip` (-o first_stage follows it)")

def test_train_refiner_refuses_first_stage_models_that_do_not_fit(mlc_pipeline, tmp_path, capsys):
    root = mlc_pipeline
    cases = [
        (["-o", "first_stage=mlc"], "first_stage=mlc needs -o first_stage_model=DIR, a `toolscout train mlc` directory"),
        (["-o", "first_stage=mlc", "-o", f"first_stage_model={root / 't2v'}"],
         "is a 'tool2vec' model; it should be a `toolscout train mlc` directory (for a tool2vec first stage: "
         "-o first_stage=tool2vec)"),
        (["-o", f"first_stage_model={root / 'mlc'}", "-o", f"tool2vec_model={root / 'mlc'}"],
         "is a 'mlc' model; it should be a `toolscout train tool2vec` directory"),
        (["-o", "first_stage=bm25", "-o", f"tool2vec_model={root / 't2v'}"],
         "behind a bm25 first stage the refiner reads description vectors"),
        # the Tool2Vec model's encoder (the default) made its vectors: another --model would be ignored
        (["--model", "minilm", "-o", f"first_stage_model={root / 'mlc'}", "-o", f"tool2vec_model={root / 't2v'}"],
         f"--model minilm: the refiner reads the Tool2Vec vectors of {root / 't2v'}, which the encoder "),
    ]
    # a Tool2Vec directory of another set: its usage names none of these tools (every candidate would have
    # been a description vector, labelled Tool2Vec's, and trained without a word)
    import shutil

    other = tmp_path / "other-t2v"
    shutil.copytree(root / "t2v", other)
    table = next(other.glob("v*/usage.npz"))
    usage = dict(np.load(table))
    np.savez(table, **{**usage, "ids": np.asarray([f"elsewhere::{i}" for i in usage["ids"]], dtype=str)})
    cases.append((["-o", f"first_stage_model={root / 'mlc'}", "-o", f"tool2vec_model={other}"],
                  "its Tool2Vec usage names none of these tools (trained on another set?)"))
    for options, says in cases:
        code = main(["train", "refiner", "--data", str(SAMPLE), "--out", str(tmp_path / "r"), "--quiet", *options])
        assert code == 1 and says in capsys.readouterr().err, options
        assert not (tmp_path / "r").exists()


def test_a_pipeline_follows_its_refiner_trained_again_in_place(trained, sample_data, tmp_path, tiny_model):
    """The pipeline saved only the refiner's directory and what was chosen for it: it recorded the model's
    vectors too, so a refiner trained again in the same directory behind another first stage (vectors of
    its own first stage now) failed to load ('usage.npz: missing'); and a pipeline saved before (its
    vectors 'first_stage' then, the model's default) read the wrong ones behind the retrained model."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(trained[0], model_dir)
    tools = list(sample_data.tools.values())
    ToolScout.from_tools(tools, retriever="dense", model=tiny_model, reranker=model_dir).save(tmp_path / "p")
    saved = json.loads((tmp_path / "p" / (tmp_path / "p" / "CURRENT").read_text().strip() / "reranker"
                        / "config.json").read_text())
    assert saved["chosen"] == [] and "vectors" not in saved
    quick = TrainConfig(batch_size=4, max_steps=2, warmup_ratio=0.0, progress=False)
    fit_refiner(sample_data, model_dir, model=tiny_model, config=quick, resume=False, first_stage="dense", depth=8,
                max_query_length=24)
    again = ToolScout.load(tmp_path / "p")
    assert again.reranker.vectors == "first_stage" and len(again.search("set an alarm for 7am", k=3)) == 3
    old = {**saved, "vectors": "tool2vec", "depth": 8}  # as saved before `chosen`: the model's of that day
    del old["chosen"]
    assert saved_as(tmp_path / "old", old).vectors == "first_stage"
    assert saved_as(tmp_path / "chose", {**old, "vectors": "description", "depth": 4}).chosen == {
        "depth": 4, "vectors": "description"}  # what differed from the model was chosen


def saved_as(folder, config) -> ToolRefinerReranker:
    """The refiner a pipeline's reranker folder holding `config` loads."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return ToolRefinerReranker.load(folder)

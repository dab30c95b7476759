from pathlib import Path

import numpy as np
import pytest

from toolscout import ToolScout
from toolscout.benchmark_sets import load_benchmark
from toolscout.cli import main
from toolscout.retrievers import make_retriever
from toolscout.retrievers.tool2vec import Tool2VecRetriever
from toolscout.tool import tool_text
from toolscout.train.data import load_training_data
from toolscout.train.tool2vec import fit_tool2vec

pytestmark = pytest.mark.slow  # trains

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


def test_vector_is_the_mean_of_usage_queries_blended_with_the_description(tools, encoder):
    usage = {"mail.send": ["write to Alice about lunch", "email the report to Bob"]}
    r = Tool2VecRetriever(encoder=encoder, usage=usage, prior=0.0)
    r.index(tools)
    q = encoder.encode(usage["mail.send"])
    mean = q.sum(0) / np.linalg.norm(q.sum(0))
    assert np.allclose(r.store.get(["mail.send"])[0], mean, atol=1e-6)
    # a tool without usage keeps its description vector
    desc = encoder.encode([tool_text(tools[0])])[0]
    assert np.allclose(r.store.get([tools[0].id])[0], desc, atol=1e-6)
    # prior p: normalise(sum of queries + p * description)
    r2 = Tool2VecRetriever(encoder=encoder, usage=usage, prior=2.0)
    r2.index(tools)
    d = encoder.encode([tool_text(next(t for t in tools if t.id == "mail.send"))])[0]
    blend = q.sum(0) + 2.0 * d
    assert np.allclose(r2.store.get(["mail.send"])[0], blend / np.linalg.norm(blend), atol=1e-6)


def test_add_usage_moves_a_tool_towards_its_traffic(tools, encoder, tmp_path):
    r = make_retriever("tool2vec", encoder=encoder, prior=0.5)
    r.index(tools)
    query = "what does my day look like on Thursday"
    before = list(r.search([query], 12).ids[0]).index("calendar.list")
    r.add_usage("calendar.list", ["what's on my agenda tomorrow", "what does my week look like",
                                  "do I have anything on Friday"])
    after = list(r.search([query], 12).ids[0]).index("calendar.list")
    assert after == 0 and after <= before
    with pytest.raises(KeyError, match="no tool"):
        r.add_usage("nope", ["x"])
    scout = ToolScout(r, tools, indexed=True)
    scout.save(tmp_path / "idx")
    again = ToolScout.load(tmp_path / "idx")
    a, b = scout.retrieve([query], 5), again.retrieve([query], 5)
    assert list(a.ids[0]) == list(b.ids[0]) and np.array_equal(a.scores[0], b.scores[0])
    # usage survives the reload: a changed description re-blends with the stored usage
    again.add([tools[8].with_changes(description="List events")])
    assert again.retriever.usage.counts["calendar.list"] == 3


def test_fit_tool2vec_writes_a_model_that_eval_loads(tmp_path, encoder):
    data = load_training_data([SAMPLE], validation_fraction=0.0)
    summary = fit_tool2vec(data, tmp_path / "model", encoder=encoder, priors=(1.0,))
    assert summary.examples == len(data.train) > 0
    r = Tool2VecRetriever(model=str(tmp_path / "model"), encoder=encoder)
    bench = load_benchmark(SAMPLE)
    r.index(bench.tools)
    used = {label for q in data.train for label in q.labels}
    assert set(r.usage.counts) == used
    code = main(["eval", str(SAMPLE), "--retriever", "tool2vec", "--model", str(tmp_path / "model"), "--quiet",
                 "--json", str(tmp_path / "m.json")])
    assert code == 0 and (tmp_path / "m.json").exists()


def test_cli_train_tool2vec_keeps_the_prior_that_validates_best(tmp_path, capsys):
    from toolscout.eval.metrics import ndcg_at_k
    from toolscout.models import model_config

    priors = [8.0, 1.0, 0.0]  # the best is neither the first nor the last
    code = main(["train", "tool2vec", "--data", str(SAMPLE), "--out", str(tmp_path / "m"), "--quiet",
                 "--validation-fraction", "0.3", "--option", f"priors={priors}"])
    assert code == 0
    assert "trained tool2vec" in capsys.readouterr().err
    # recompute each prior's validation nDCG@10 from the saved model, on the same held-out queries
    data = load_training_data([SAMPLE], validation_fraction=0.3)
    assert data.validation
    recomputed = []
    for prior in priors:
        r = Tool2VecRetriever(model=str(tmp_path / "m"), prior=prior)
        r.index(list(data.tools.values()))
        ranked = r.search([q.text for q in data.validation], 10)
        recomputed.append(100 * np.mean([ndcg_at_k(list(ids), set(q.labels), 10)
                                         for q, (ids, _s) in zip(data.validation, ranked)]))
    summary = model_config(tmp_path / "m", method="tool2vec")[1]["summary"]
    assert [h["prior"] for h in summary["history"]] == priors
    np.testing.assert_allclose([h["validation_ndcg@10"] for h in summary["history"]], recomputed, atol=1e-3)
    best = priors[int(np.argmax(recomputed))]  # the first of equal bests, as the trainer keeps it
    assert len(set(np.round(recomputed, 6))) > 1  # the priors do rank differently: the choice means something
    assert Tool2VecRetriever(model=str(tmp_path / "m")).prior == best == summary["config"]["prior"]

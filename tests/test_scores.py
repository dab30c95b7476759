"""Scores an agent can trust: calibrated probabilities (fitting, ECE, the reliability table, the threshold),
abstention through the service, and deprecated tools ranked below their replacements."""

import numpy as np
import pytest

from toolscout import Tool, ToolScout
from toolscout.deprecation import Deprecation, deprecation_of, rank_below_replacements, replacement_named
from toolscout.eval.calibration import (
    AbstentionCase,
    LogisticModel,
    abstention,
    any_relevant,
    choose_threshold,
    expected_calibration_error,
    reliability_table,
)
from toolscout.relevance import FEATURES, Calibration, shipped_calibration

# ----------------------------------------------------------------------------- measuring calibration


def test_expected_calibration_error_against_a_hand_worked_example():
    # bins of width 0.5 (bins=2): [0, .5) holds .1 .2 .4 (labels 0 0 1): mean p .2333, observed .3333;
    # [.5, 1] holds .6 .9 1.0 (labels 1 0 1): mean p .8333, observed .6667.
    # ECE = 3/6 * |.2333 - .3333| + 3/6 * |.8333 - .6667| = .05 + .08333 = .13333
    p = [0.1, 0.2, 0.4, 0.6, 0.9, 1.0]
    y = [0, 0, 1, 1, 0, 1]
    assert expected_calibration_error(p, y, bins=2) == pytest.approx(0.05 + 1 / 12)
    # ten bins: each item alone in its bin but .9 and 1.0 share the last: |.1-0|+|.2-0|+|.4-1|+|.6-1| = 1.3,
    # plus 2 * |.95 - .5| = .9, over 6 items
    assert expected_calibration_error(p, y) == pytest.approx((1.3 + 0.9) / 6)
    assert expected_calibration_error([0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3], [1, 1, 1] + [0] * 7) \
        == pytest.approx(0.0)
    assert expected_calibration_error([], []) == 0.0


def test_reliability_table_rows_count_and_average_each_bin():
    rows = reliability_table([0.1, 0.2, 0.4, 0.6, 0.9, 1.0], [0, 0, 1, 1, 0, 1], bins=2)
    assert [(r["low"], r["high"], r["count"]) for r in rows] == [(0.0, 0.5, 3), (0.5, 1.0, 3)]
    assert rows[0]["predicted"] == pytest.approx(0.7 / 3) and rows[0]["observed"] == pytest.approx(1 / 3)
    assert rows[1]["predicted"] == pytest.approx(2.5 / 3) and rows[1]["observed"] == pytest.approx(2 / 3)
    empty = reliability_table([0.05], [1], bins=4)
    assert [r["count"] for r in empty] == [1, 0, 0, 0] and empty[1]["predicted"] is None


def test_calibration_measures_refuse_what_is_not_a_probability():
    with pytest.raises(ValueError, match="one label per probability"):
        expected_calibration_error([0.5, 0.5], [1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.5], [1])


def test_logistic_fit_matches_a_reference_library():
    sklearn = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 2)) * [1.0, 3.0] + [0.5, -1.0]
    y = (rng.random(600) < 1 / (1 + np.exp(-(0.8 * x[:, 0] - 0.4 * x[:, 1] + 0.2)))).astype(float)
    ours = LogisticModel.fit(("a", "b"), x, y, l2=0.0)
    reference = sklearn.LogisticRegression(C=1e9, max_iter=10_000, tol=1e-12).fit(x, y)
    assert ours.predict(x) == pytest.approx(reference.predict_proba(x)[:, 1], abs=1e-5)
    again = LogisticModel.from_dict(ours.to_dict())
    assert again == ours


def test_logistic_fit_refuses_labels_of_one_kind():
    with pytest.raises(ValueError, match="both relevant and irrelevant"):
        LogisticModel.fit(("a",), np.ones((3, 1)), np.ones(3))


def test_the_chance_that_one_of_several_is_relevant():
    assert any_relevant([0.2, 0.2, 0.2]) == pytest.approx(1 - 0.8 ** 3)  # 0.488
    assert any_relevant([0.5]) == 0.5 and any_relevant([]) == 0.0 and any_relevant([1.0, 0.3]) == 1.0


def test_abstention_threshold_keeps_the_asked_share_of_recall():
    # set a: recall 1 at best values .9 .8 .7 .6; set b: recall 1 at .5, recall 0 at .4; no-match bests beside
    cases = [AbstentionCase("a", s, 1.0, n) for s, n in ((.9, .3), (.8, .65), (.7, .2), (.6, .55))]
    cases += [AbstentionCase("b", .5, 1.0, .1), AbstentionCase("b", .4, 0.0, .45)]
    # macro recall without abstention: (1 + 0.5) / 2 = 0.75. At t=.6: a keeps 1, b keeps 0 -> 0.5 (67%);
    # at t=.5: a 1, b 0.5 -> 0.75 (100%). keep=0.9 -> the highest threshold with >= 0.675 is 0.5.
    assert choose_threshold(cases, keep=0.9) == 0.5
    assert choose_threshold(cases, keep=0.6) == 0.6
    report = abstention(cases, 0.5)
    assert report["queries"] == 6
    assert report["nomatch_abstained"] == pytest.approx(100 * 4 / 6)  # .3 .2 .1 .45 are below .5; .65 .55 not
    assert report["normal_answered"] == pytest.approx(100 * 5 / 6)  # all but the .4
    assert report["recall_without_abstention"] == pytest.approx(100 * 5 / 6)
    assert report["recall"] == pytest.approx(100 * 5 / 6)  # the query dropped (.4) had recall 0 anyway
    assert abstention(cases, 0.75)["recall"] == pytest.approx(100 * 2 / 6)


# ----------------------------------------------------------------------------- the shipped calibration


@pytest.fixture(scope="module")
def default_scout(encoder):
    from conftest import sample_tools

    return ToolScout.from_tools(sample_tools(), encoder=encoder)


def test_the_default_pipeline_ships_a_calibration_and_others_get_none(default_scout, tools):
    calibration = default_scout.calibration
    assert calibration is not None and tuple(calibration.model.features) == FEATURES
    assert 0.0 < calibration.threshold < 1.0
    assert set(calibration.about["fitted_on"]) == {"apibank", "gorilla_torchhub", "metatool", "rotbench",
                                                   "sealtools", "toollens"}  # never the zero-shot sets
    bm25 = ToolScout.from_tools(tools, retriever="bm25")
    assert bm25.calibration is None and shipped_calibration(bm25.spec) is None
    assert all(h.probability is None and "probability" not in h.to_dict() for h in bm25.search("weather", k=3))


def test_probability_is_bounded_and_never_rises_down_a_list(default_scout):
    for task in ("what will the weather be tomorrow in Paris", "send an email to my boss and add a meeting",
                 "qwxzv plork", "play music"):
        hits = default_scout.search(task, k=10, match_names=False)
        probabilities = [h.probability for h in hits]
        assert all(0.0 <= p <= 1.0 for p in probabilities)
        assert probabilities == sorted(probabilities, reverse=True)  # ordered as the scores are
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(h.to_dict()["probability"] == round(h.probability, 4) for h in hits)


def test_probability_tells_a_sure_match_from_a_guess(default_scout):
    sure = default_scout.search("what will the weather be tomorrow in Paris", k=1)[0]
    guess = default_scout.search("qwxzv plork", k=1)[0]
    assert sure.tool.id == "weather.get_forecast"
    assert sure.probability > default_scout.calibration.threshold > guess.probability


def test_a_probability_does_not_depend_on_k(default_scout):
    task = "send an email to my boss"
    five = default_scout.search(task, k=5, match_names=False)
    two = default_scout.search(task, k=2, match_names=False)
    assert [(h.tool.id, h.probability) for h in two] == [(h.tool.id, h.probability) for h in five[:2]]


def test_min_probability_abstains_where_hits_have_probabilities(default_scout, tools):
    import warnings

    from toolscout.errors import InvalidRequest
    from toolscout.hits import UncalibratedWarning

    assert default_scout.search("qwxzv plork", k=3, min_probability="calibrated") == []
    assert default_scout.search("what will the weather be tomorrow in Paris", k=3, min_probability="calibrated")
    assert default_scout.search("qwxzv plork", k=3, min_probability=0.0)
    # no calibration, no probabilities: nothing to abstain on, which the search says rather than ignores
    bm25 = ToolScout.from_tools(tools, retriever="bm25")
    for threshold in ("calibrated", 0.99):
        with pytest.warns(UncalibratedWarning, match=f"^min_probability {threshold!r}: this pipeline has no "
                                                     "calibration .*abstain on the score with min_score instead$"):
            assert bm25.search("weather", min_probability=threshold)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pipeline with a calibration, or no threshold asked: no warning
        default_scout.search("weather", min_probability="calibrated")
        bm25.search("weather")
    with pytest.raises(InvalidRequest, match="from 0 to 1"):
        default_scout.search("weather", min_probability=1.5)


def test_what_learning_lifts_for_a_task_carries_its_learned_probability(encoder):
    from test_learning import RAIN, WEATHERISH, background, traffic

    from toolscout.query import Query

    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    untaught = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(traffic(RAIN, "advice.umbrella", 50) + background())
    task = "will I need a raincoat on Sunday"
    learned = scout.learning.lifts([Query.of(task)], lambda _t: True, scout._namespace_of)[0]["advice.umbrella"][0]
    before = next(h.probability for h in untaught.search(task, k=10, match_names=False)
                  if h.tool.id == "advice.umbrella")
    hits = scout.search(task, k=3, min_probability="calibrated")
    assert hits[0].tool.id == "advice.umbrella"
    # the deployment's own evidence is a probability of the same thing: the hit has at least it
    assert hits[0].probability >= learned > before
    assert [h.probability for h in hits] == sorted((h.probability for h in hits), reverse=True)


def test_a_calibration_of_other_features_is_refused_with_the_fix():
    model = LogisticModel(("score",), (0.0,), (1.0,), (1.0,), 0.0)
    with pytest.raises(Exception, match="build_calibration.py"):
        Calibration(model, 0.2, {}, {})


def test_near_twin_tools_split_their_probability_but_the_search_still_answers(encoder):
    from conftest import sample_tools

    twins = [Tool(f"{ns}.echo", "echo", "Echo the given text back to the caller.", namespace=ns)
             for ns in ("alpha", "beta", "gamma")]
    scout = ToolScout.from_tools(sample_tools() + twins, encoder=encoder)
    task = "echo this text back"
    hits = scout.search(task, k=5, match_names=False)
    assert {h.tool.id for h in hits[:3]} == {t.id for t in twins}
    # which of three equal tools the task needs, nobody can say: none is surely the one alone, but one of
    # them likely is, and that is what abstention asks (hits.abstains)
    twin_p = [h.probability for h in hits[:3]]
    assert max(twin_p) < 0.6 and any_relevant(twin_p) > max(twin_p) + 0.2
    assert scout.search(task, k=5, min_probability="calibrated")


def test_a_reranked_pipeline_abstains_on_its_first_stage_whether_or_not_the_llm_answers(encoder, default_scout):
    """Behind an LLM reranker, `calibrated` abstained on nothing and a number abstained only when the LLM
    failed (the fallback kept the first stage's probabilities). Now both are read on the first stage's
    ranking before reranking: an abstaining task costs no LLM call, and the answer does not depend on it."""
    from conftest import sample_tools
    from fakellm import FakeLLM, Reply

    from toolscout.llm import LLMSettings
    from toolscout.rerank.llm import LLMReranker

    sure = [{"token": "true", "logprob": -0.1, "top_logprobs": [{"token": "true", "logprob": -0.1},
                                                                 {"token": "false", "logprob": -2.4}]}]
    weather, nonsense = "what will the weather be tomorrow in Paris", "qwxzv plork"
    with FakeLLM(responder=lambda request: Reply("true", logprobs=sure)) as llm:
        reranker = LLMReranker(LLMSettings(base_url=llm.url, model="m", max_retries=0, timeout=5.0))
        scout = ToolScout.from_tools(sample_tools(), encoder=encoder, reranker=reranker)
        for threshold in ("calibrated", 0.5):
            assert scout.search(nonsense, k=3, min_probability=threshold) == []
        assert llm.calls == 0  # abstained before the reranker
        reranked = scout.search(weather, k=3, min_probability="calibrated")
        assert reranked and llm.calls > 0 and reranked[0].probability is None  # the LLM's order, its scores
        assert scout.search(nonsense, k=3)  # no threshold, no abstention

        llm.responder = lambda request: Reply(status=500)  # the LLM fails from now on: the same decisions
        for threshold in ("calibrated", 0.5):
            assert scout.search(nonsense, k=3, min_probability=threshold) == []
        with pytest.warns(UserWarning, match="HTTP 500"):
            kept = scout.search(weather, k=3, min_probability="calibrated", match_names=False)
    first_stage = default_scout.search(weather, k=3, match_names=False)
    assert [(h.tool.id, h.probability) for h in kept] == [(h.tool.id, h.probability) for h in first_stage]


def test_the_nonsense_task_abstains_through_the_service(tmp_path, default_scout):
    from toolscout.hits import CALIBRATED
    from toolscout.serve import ToolService

    default_scout.save(tmp_path / "idx")
    with ToolService.open(tmp_path / "idx", fsync=False, min_probability=CALIBRATED, batch_workers=0) as service:
        assert service.search("qwxzv plork", k=5) == []
        found = service.search("what will the weather be tomorrow in Paris", k=5)
        assert found[0].tool.id == "weather.get_forecast" and found[0].probability is not None
        assert service.search("qwxzv plork", k=5, min_probability=None)  # a request may turn it off


def test_a_probability_threshold_on_a_pipeline_without_calibration_is_said_at_start(tmp_path, tools, caplog):
    # a BM25 pipeline has no calibration: the threshold abstains on nothing, which the log says once
    from toolscout.hits import CALIBRATED
    from toolscout.serve import ToolService

    ToolScout.from_tools(tools, retriever="bm25").save(tmp_path / "bm25")
    with caplog.at_level("WARNING", logger="toolscout.serve"):
        with ToolService.open(tmp_path / "bm25", fsync=False, min_probability=CALIBRATED, batch_workers=0) as service:
            assert service.search("qwxzv plork book", k=5)  # answered: nothing to abstain on
        with ToolService.open(tmp_path / "bm25", fsync=False, batch_workers=0):
            pass
    said = [r.getMessage() for r in caplog.records if "has no calibration" in r.getMessage()]
    assert said == ["min_probability 'calibrated': this pipeline has no calibration (only the default pipeline "
                    "ships one, docs/scores.md): hits carry no probability, and no search abstains on probability "
                    "(min_probability is off)"]


# ----------------------------------------------------------------------------- deprecated tools

FILESYSTEM = [  # as @modelcontextprotocol/server-filesystem lists them (shortened)
    Tool("fs.read_file", "read_file", "Read the complete contents of a file as text. DEPRECATED: Use read_text_file "
         "instead.", namespace="fs"),
    Tool("fs.read_text_file", "read_text_file", "Read the complete contents of a file from the file system as "
         "text. Handles various text encodings and provides detailed error messages if the file cannot be read. "
         "Use this tool when you need to examine the contents of a single file. Use the 'head' parameter to read "
         "only the first N lines of a file, or the 'tail' parameter to read only the last N lines of a file. "
         "Operates on the file as text regardless of extension. Only works within allowed directories.",
         namespace="fs"),
    Tool("fs.read_media_file", "read_media_file", "Read an image or audio file.", namespace="fs"),
    Tool("fs.write_file", "write_file", "Create a new file or overwrite an existing file with new content.",
         namespace="fs"),
    Tool("fs.list_directory", "list_directory", "Get a detailed listing of all files and directories.",
         namespace="fs"),
]


@pytest.mark.parametrize("description, raw, expected", [
    ("Read a file as text. DEPRECATED: Use read_text_file instead.", None, Deprecation("read_text_file")),
    ("[Deprecated] Lists users; superseded by `list_members`.", None, Deprecation("list_members")),
    ("This endpoint is deprecated in favour of getUserV2.", None, Deprecation("getUserV2")),
    ("Describes ClassicLink instances (Deprecated).", None, None),  # not said of the tool in a form we read
    ("Associates an address. PublicIp (string) - Deprecated. Use IpAddress instead.", None, None),  # a parameter
    ("Search the web.", None, None),
    ("Search the web.", {"annotations": {"deprecated": True}}, Deprecation()),
    ("Search the web.", {"annotations": {"deprecated": "use web_search_v2 instead"}}, Deprecation("web_search_v2")),
    ("Returns a pet.", {"deprecated": True, "method": "GET"}, Deprecation()),  # a flag at the top of raw
])
def test_a_tool_that_says_it_is_deprecated_is_recognised(description, raw, expected):
    assert deprecation_of(Tool("t", "old_tool", description, raw=raw)) == expected


USERS_V1_V2 = """\
{version}
info: {{title: Users, version: "1"}}
paths:
  /v1/users/{{id}}:
    get: {{operationId: getUserV1, deprecated: true, summary: "Get a user by id. Use getUserProfile instead.",
          parameters: [{{name: id, in: path, required: true, type: string}}], responses: {{"200": {{description: ok}}}}}}
  /v2/users/{{id}}:
    get: {{operationId: getUserProfile, summary: Fetch the profile of a user,
          parameters: [{{name: id, in: path, required: true, type: string}}], responses: {{"200": {{description: ok}}}}}}
"""


@pytest.mark.parametrize("version", ["openapi: 3.0.0", "swagger: '2.0'"])
def test_an_openapi_operation_marked_deprecated_ranks_below_the_replacement_it_names(tmp_path, version):
    # the operation's own `deprecated: true` is the flag; its summary names the replacement
    from toolscout import load_tools

    spec = tmp_path / "users.yaml"
    spec.write_text(USERS_V1_V2.format(version=version))
    old, new = load_tools(spec)
    assert deprecation_of(old) == Deprecation("getUserProfile") and deprecation_of(new) is None
    scout = ToolScout.from_tools([old, new], retriever="bm25")
    assert scout.replacements() == {"users.getUserV1": "users.getUserProfile"}
    assert [h.tool.name for h in scout.search("get a user by id", k=2)] == ["getUserProfile", "getUserV1"]


def test_a_replacement_is_the_name_given_after_use_or_in_favour_of():
    assert replacement_named("DEPRECATED: use `read_text_file` instead.") == "read_text_file"
    assert replacement_named("replaced by files.read_v2.") == "files.read_v2"
    assert replacement_named("nothing here") is None


def test_rank_below_replacements_moves_only_what_it_must():
    successor = {"old": "new"}.get
    # the replacement ranked lower: it takes the old tool's place and score, the old one follows it
    ids, scores = rank_below_replacements(np.array(["a", "old", "b", "new"], dtype=object),
                                          np.array([4.0, 3.0, 2.0, 1.0]), successor)
    assert list(ids) == ["a", "new", "old", "b"] and list(scores) == [4.0, 3.0, 2.5, 2.0]
    # the replacement not ranked at all: it comes in, the list keeps its length
    ids, scores = rank_below_replacements(np.array(["old", "a"], dtype=object), np.array([2.0, 1.0]), successor)
    assert list(ids) == ["new", "old"] and list(scores) == [2.0, 1.5]
    # already above: nothing moves
    ids, scores = rank_below_replacements(np.array(["new", "old"], dtype=object), np.array([2.0, 1.0]), successor)
    assert list(ids) == ["new", "old"] and list(scores) == [2.0, 1.0]


@pytest.mark.parametrize("retriever", ["bm25", "hybrid"])
def test_a_deprecated_tool_ranks_below_its_replacement(retriever, encoder):
    options = {"encoder": encoder} if retriever != "bm25" else {}
    scout = ToolScout.from_tools(FILESYSTEM, retriever=retriever, **options)
    task = "read the complete contents of a file as text"
    scout.demote_deprecated = False
    before = [h.tool.id for h in scout.search(task, k=3)]
    assert before[0] == "fs.read_file"  # its description matches the task best
    scout.demote_deprecated = True
    hits = scout.search(task, k=3)
    assert [h.tool.id for h in hits][:2] == ["fs.read_text_file", "fs.read_file"]
    assert hits[0].score >= hits[1].score
    # a search that may not return the replacement leaves the deprecated tool where it was
    assert scout.search(task, k=1, filter=_without("fs.read_text_file"))[0].tool.id == "fs.read_file"


def test_a_task_near_a_deprecated_tools_name_gets_its_replacement_first(encoder):
    # "read a file" is near read_file's name (one word between), which put the deprecated tool first as
    # the tool the task names; naming it exactly still does, and so does a near match once the search may
    # not return the replacement
    scout = ToolScout.from_tools(FILESYSTEM, encoder=encoder)
    hits = scout.search("read a file", k=len(FILESYSTEM))
    assert hits[0].tool.id == "fs.read_text_file" and {h.match for h in hits} == {"retrieval"}
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    named, after = scout.search("read_file", k=2)
    assert (named.tool.id, named.match, after.tool.id) == ("fs.read_file", "name", "fs.read_text_file")
    assert named.score >= after.score  # first, and scored so (it had its own lower score, out of order)
    alone = scout.search("read a file", k=1, filter=_without("fs.read_text_file"))[0]
    assert (alone.tool.id, alone.match) == ("fs.read_file", "name")


def test_a_replacement_the_catalog_lacks_changes_nothing(tools):
    old = Tool("weather.old_forecast", "old_forecast", "Weather forecast for a city. Deprecated: use forecast_v9 "
               "instead.", namespace="weather")
    scout = ToolScout.from_tools(tools + [old], retriever="bm25")
    scout.demote_deprecated = False
    before = [h.tool.id for h in scout.search("weather forecast for a city", k=5)]
    scout.demote_deprecated = True
    assert [h.tool.id for h in scout.search("weather forecast for a city", k=5)] == before


def test_deprecations_follow_writes():
    scout = ToolScout.from_tools(FILESYSTEM, retriever="bm25")
    task = "read the complete contents of a file as text"
    scout.add([FILESYSTEM[0].with_changes(description="Read the complete contents of a file as text.")])
    assert scout.search(task, k=1)[0].tool.id == "fs.read_file"  # no longer deprecated
    scout.add([FILESYSTEM[0]])
    assert scout.search(task, k=1)[0].tool.id == "fs.read_text_file"
    scout.remove(["fs.read_text_file"])
    assert scout.search(task, k=1)[0].tool.id == "fs.read_file"


def _without(tool_id):
    from toolscout.results import Filter

    return Filter.make(exclude_ids=[tool_id])


def test_min_probability_on_the_command_line():
    import argparse

    from toolscout.cli.serve import add_service_arguments, probability_threshold, service_options

    assert probability_threshold("0.3") == 0.3 and probability_threshold("calibrated") == "calibrated"
    with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 1"):
        probability_threshold("2")
    parser = argparse.ArgumentParser()
    add_service_arguments(parser)
    for flags, expected in (([], "absent"), (["--min-probability", "off"], None),
                            (["--min-probability", "0.4"], 0.4), (["--min-probability", "calibrated"], "calibrated")):
        options = service_options(parser.parse_args(flags))
        assert options.get("min_probability", "absent") == expected  # absent: serve off, the gateway calibrated


def test_http_search_answers_each_hit_with_its_probability(tmp_path, default_scout):
    from starlette.testclient import TestClient

    from toolscout.serve import ToolService, create_app

    default_scout.save(tmp_path / "idx")
    with ToolService.open(tmp_path / "idx", fsync=False, batch_workers=0) as service:
        client = TestClient(create_app(service))
        body = client.post("/search", json={"query": "what will the weather be tomorrow in Paris", "k": 3}).json()
        hits = body["results"][0]["hits"]
        assert hits[0]["id"] == "weather.get_forecast" and 0 < hits[0]["probability"] <= 1
        assert [h["probability"] for h in hits] == sorted((h["probability"] for h in hits), reverse=True)
        nonsense = client.post("/search", json={"query": "qwxzv plork", "min_probability": 0.3}).json()["results"][0]
        assert nonsense["abstained"] and nonsense["hits"] == []
        assert client.post("/search", json={"query": "qwxzv plork"}).json()["results"][0]["hits"]  # serve: off
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert "probability" in schema["HitOut"]["properties"] and "min_probability" in schema["SearchRequest"]["properties"]


def test_a_catalog_of_two_tools_abstains_on_tasks_neither_fits_and_keeps_its_scores_in_range(encoder):
    """mcp-server-time's two tools, as the real server lists them: for a task neither fits, the best dense
    cosine is about 0, and dividing by it made the top a full match (probability 0.999) and the other tool
    score -46. A task the server serves still gets its tool with the probability it had."""
    from gateways import TIME_SERVER

    from toolscout.ingest import load_tools

    scout = ToolScout.from_tools(load_tools(f"mcp:{TIME_SERVER} --local-timezone Europe/Paris"), encoder=encoder)
    for nonsense in ("qwxzv plork", "order a pizza with extra cheese"):
        hits = scout.search(nonsense, k=2)
        assert max(h.probability for h in hits) < 0.05 and min(h.score for h in hits) > -4.0, hits
        assert scout.search(nonsense, k=2, min_probability="calibrated") == []
    best = scout.search("convert 9am London time to New York time", k=2)[0]
    assert best.tool.name == "convert_time" and best.probability > 0.5


def test_a_ranking_where_nothing_scored_above_zero_has_finite_features_and_its_top_is_itself():
    """A namespace of one tool that shares nothing with the task scores 0: log(crowd) was log(0), and the
    calibration read the -inf as a sure hit (probability 1.0, no abstention)."""
    import numpy as np

    from toolscout.relevance import FEATURES, ranking_features

    rows = ranking_features("list my folder", [0.0, 0.0], [0.05, 0.02], np.eye(2, 4))
    assert np.isfinite(rows).all()
    assert rows[0, FEATURES.index("relative")] == 1.0 and rows[0, FEATURES.index("log_crowd")] == np.log(2)

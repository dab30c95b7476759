"""Learning from use as its own channel (`toolscout.learning`): the calibration and the memory checked against
brute force, the merge worked out by hand, what a request teaches, and the pipeline's guarantees: untaught
tasks and new tools keep their ranking, a source taken back or a rollback restores rankings exactly, every
event is scored before it is learned, and a namespace whose learning goes wrong turns it down by itself."""

import itertools
import random

import numpy as np
import pytest
from traffic import CALENDAR, FACTS, FILES, MAIL, RAIN

from toolscout import ToolScout
from toolscout.feedback import FeedbackEvent, Scored
from toolscout.learning import CAUTIOUS_GATE, GATE, LearnedChannel, Lesson
from toolscout.learning.calibration import PRIOR, SIM_BINS, BinCounts, Calibration, isotonic, sim_bin
from toolscout.learning.incidental import teachable, teaches_anything
from toolscout.learning.memory import ANCHORS, FEW_TOOLS, RequestMemory, _similarities
from toolscout.learning.space import HashedSpace
from toolscout.results import Results
from toolscout.tool import Tool

# ------------------------------------------------------------------------------------ calibration

def brute_isotonic(values, weights):
    """The weighted least-squares non-decreasing fit, by trying every partition into constant blocks."""
    n, best = len(values), None
    for cuts in itertools.product([False, True], repeat=n - 1):
        blocks, start = [], 0
        for i, cut in enumerate(cuts + (True,)):
            if cut:
                blocks.append((start, i + 1))
                start = i + 1
        means = [np.average(values[a:b], weights=weights[a:b]) for a, b in blocks]
        if any(x > y + 1e-12 for x, y in zip(means, means[1:])):
            continue
        fit = np.concatenate([[m] * (b - a) for m, (a, b) in zip(means, blocks)])
        cost = float(np.sum(weights * (values - fit) ** 2))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, fit)
    return best[1]


@pytest.mark.parametrize("seed", range(6))
def test_isotonic_is_the_least_squares_monotone_fit(seed):
    rng = np.random.default_rng(seed)
    values, weights = rng.random(7), rng.integers(1, 5, 7).astype(float)
    np.testing.assert_allclose(isotonic(values, weights), brute_isotonic(values, weights), atol=1e-12)


def test_bin_rates_shrink_toward_zero_with_little_evidence():
    counts = BinCounts.zeros(3)
    counts.hits[:] = [0, 1, 10]
    counts.trials[:] = [0, 1, 10]
    # hits / (trials + PRIOR), already increasing
    np.testing.assert_allclose(counts.rates(increasing=True), [0, 1 / (1 + PRIOR), 10 / (10 + PRIOR)])


# ------------------------------------------------------------------------------------ memory

def brute_calibration(memory: RequestMemory) -> Calibration:
    """The calibration recomputed from nothing: for each anchor (the ANCHORS smallest hashes), every taught
    tool's highest similarity over the other requests that taught it; its three nearest tools (ties by id)
    are trials in their similarity bins, hits where the anchor taught them, and those at the anchor's highest
    similarity (the nearest request's tools) are counted again in the nearest table. The anchor also plays a
    task of a tool nobody taught: its three nearest tools other than its own are misses in the cautious
    table, each weighing the share of (request, tool) pairs that were their tool's first, or the share of the
    catalog's tools nobody taught when the memory knows the catalog's size and that is more."""
    from toolscout.learning.calibration import NEIGHBOUR_TOOLS, RANK_EDGES, fit, rank_bucket
    from toolscout.learning.memory import key_hash

    neighbours, nearest = BinCounts.zeros(SIM_BINS), BinCounts.zeros(SIM_BINS)
    tools = len(memory.rows_of_tool)
    share = tools / sum(len(taught) for taught in memory.taught.values()) * min(1.0, FEW_TOOLS / tools)
    if memory.catalog_size:
        share = max(share, 1.0 - tools / memory.catalog_size)
    for anchor in sorted(memory.row_of, key=key_hash)[:ANCHORS]:
        row = memory.row_of[anchor]
        best = {}
        for tool, rows in memory.rows_of_tool.items():
            others = [r for r in rows if r != row]
            if others:
                best[tool] = float(_similarities(memory.vectors[[row]], memory.vectors[others]).max())
        ranked = sorted(best.items(), key=lambda t: (-t[1], t[0]))
        for tool, sim in ranked[:NEIGHBOUR_TOOLS]:
            hit = float(tool in memory.taught[anchor])
            for counts in (neighbours, nearest) if sim >= ranked[0][1] else (neighbours,):
                counts.hits[sim_bin(sim)] += hit
                counts.trials[sim_bin(sim)] += 1
        for _tool, sim in [t for t in ranked if t[0] not in memory.taught[anchor]][:NEIGHBOUR_TOOLS]:
            neighbours.trials[sim_bin(sim)] += share
    found = np.zeros(len(RANK_EDGES) + 1)
    for tools in memory.taught.values():
        for entry in tools.values():
            found[rank_bucket(entry.untaught_rank)] += 1
    return fit(neighbours, nearest, found, len(memory.taught))


def churned_memory(seed: int = 3, steps: int = 300, per_cluster: int = 15) -> "tuple[RequestMemory, np.ndarray]":
    """A memory after `steps` random writes (70% lessons in 12 clusters of `per_cluster` requests, 30% a held
    lesson taken back, so rows are freed and reused), and the clusters' centres."""
    rng = random.Random(seed)
    base = np.random.default_rng(seed).normal(size=(12, 16)).astype(np.float32)
    tools = [f"t{i}" for i in range(6)]
    held: list[tuple] = []
    memory = RequestMemory(16)
    for step in range(steps):
        if held and rng.random() < 0.3:
            key, _v, tool, source, _r, when = held.pop(rng.randrange(len(held)))
            memory.remove([(key, tool, source, when)])
        else:
            cluster = rng.randrange(12)
            key = f"request {cluster} {rng.randrange(per_cluster)}"
            vector = base[cluster] + 0.3 * np.random.default_rng(hash(key) % 2**32).normal(size=16)
            lesson = (key, vector.astype(np.float32), tools[cluster % 6 if rng.random() < 0.8 else rng.randrange(6)],
                      f"s{rng.randrange(3)}", rng.choice([1, 2, 5, None]), float(step))
            if memory.row_of.get(key) is not None:  # a key keeps the vector it was first taught with
                lesson = (key, None, *lesson[2:])
            memory.add([lesson])
            held.append(lesson)
    return memory, base


def test_the_memory_kept_up_write_by_write_equals_one_built_from_nothing():
    """Anchors, their similarities and the calibration are kept up incrementally as requests come and go;
    after any sequence of writes they must be what a brute-force pass over the final memory gives, and what
    a memory built at once from the same lessons holds."""
    memory, base = churned_memory()
    got = memory.calibration
    assert got.to_dict() == brute_calibration(memory).to_dict()
    fresh = RequestMemory(16)  # the lessons still held, taught at once in another order
    fresh.add([(k, memory.vectors[memory.row_of[k]], tool, source, rank, when)
               for k, tools_ in sorted(memory.taught.items(), reverse=True) for tool, entry in tools_.items()
               for source, lessons in entry.lessons.items() for when, rank in lessons[::-1]])
    assert fresh.pairs() == memory.pairs() and fresh.anchors == memory.anchors
    # what each entry derives from its lessons is what it would be had the lessons taken back never come
    assert ({(k, t): (e.untaught_rank, e.last_taught) for k, tools_ in memory.taught.items() for t, e in tools_.items()}
            == {(k, t): (e.untaught_rank, e.last_taught) for k, tools_ in fresh.taught.items() for t, e in tools_.items()})
    assert fresh.calibration.to_dict() == got.to_dict()
    queries = base[:4]
    assert memory.nearest_tools(queries) == fresh.nearest_tools(queries)


@pytest.mark.parametrize("rows", [1, 5, 50, 500])  # one request; fewer than held (scan and cut); all held
def test_nearest_tools_are_those_the_nearest_requests_taught_as_brute_force_finds_them(rows):
    memory, base = churned_memory(seed=5, steps=600, per_cluster=40)
    memory.remove([(key, tool, None, None) for key in sorted(memory.taught)[::7] for tool in list(memory.taught[key])])
    assert memory._free and len(memory) > 50 + 16  # freed rows, and more requests than the scan passes on
    tasks = np.concatenate([base, np.random.default_rng(9).normal(size=(60, 16))]).astype(np.float32)  # > one chunk
    tasks /= np.linalg.norm(tasks, axis=1, keepdims=True)
    for task, got in zip(tasks, memory.nearest_tools(tasks, rows)):
        sims = {key: float(_similarities(task[None, :], memory.vectors[[row]])[0, 0])
                for key, row in memory.row_of.items()}
        nearest = sorted(sims, key=lambda key: (-sims[key], key))[:rows]
        best: dict = {}
        for key in nearest:
            for tool, entry in memory.taught[key].items():
                best.setdefault(tool, (sims[key], entry.last_taught))
        assert got == sorted(((t, s, w) for t, (s, w) in best.items()), key=lambda item: (-item[1], item[0]))


# ------------------------------------------------------------------------------------ the merge

class _Space:
    name, dim, case_blind = "fixed", 2, True

    def tasks(self, queries):
        return np.tile(np.asarray([[1.0, 0.0]], dtype=np.float32), (len(queries), 1))

    def requests(self, texts):
        return np.asarray([[1.0, 0.0] if "near" in t else [0.0, 1.0] for t in texts], dtype=np.float32)


def test_a_lifted_tool_goes_where_its_probability_earns_and_scores_stay_in_order():
    channel = LearnedChannel(_Space())
    channel.teach([Lesson("a near request", "x", "s", 3)])  # one lesson: the calibration is set by hand below
    channel.memory.calibration = Calibration(by_similarity=np.full(SIM_BINS, 0.5), by_nearest=np.full(SIM_BINS, 0.5),
                                             by_rank=np.asarray([0.6, 0.4, 0.1] + [0.0] * 11))
    base = Results((np.asarray(["u1", "u2", "x", "u3"], dtype=object),), (np.asarray([4.0, 3.0, 2.0, 1.0]),))
    ranked = channel.rank(["task"], base, 4, lambda t: True, lambda t: None)
    ids, scores = ranked[0]
    # x's learned probability 0.5 passes the gate and beats rank 2's 0.4: between u1 (0.6) and u2
    assert list(ids) == ["u1", "x", "u2", "u3"]
    # its score is the untaught score at probability 0.5: halfway between ranks 1 (0.6, 4.0) and 2 (0.4, 3.0)
    np.testing.assert_allclose(scores, [4.0, 3.5, 3.0, 1.0])
    channel.settings = channel.settings.updated({"*": 0.5})  # weight 0.5: 0.25 is under the gate
    assert list(channel.rank(["task"], base, 4, lambda t: True, lambda t: None)[0][0]) == ["u1", "u2", "x", "u3"]
    assert GATE > 0.25


def test_a_taught_tool_passes_taught_tools_on_its_own_table_and_untaught_ones_only_on_the_cautious_one():
    """x was taught by the request nearest to the task: 0.7 in the nearest request's table, 0.45 in the
    cautious table of every near tool. It passes t2 (0.5 at rank 2), which the deployment was taught too, on
    the first; not u1 (0.6), which nobody taught and only 0.45 could pass; and when t2 was never taught,
    not t2 either. u3 (0.3) it passes on 0.45, but not on a cautious 0.35, under the cautious gate."""
    base = Results((np.asarray(["u1", "t2", "u3", "x"], dtype=object),), (np.asarray([4.0, 3.0, 2.0, 1.0]),))
    by_rank = np.asarray([0.6, 0.5, 0.3, 0.1] + [0.0] * 10)
    for t2_taught, cautious, want in ((True, 0.45, ["u1", "x", "t2", "u3"]), (False, 0.45, ["u1", "t2", "x", "u3"]),
                                      (True, 0.35, ["u1", "t2", "u3", "x"])):
        channel = LearnedChannel(_Space())
        channel.teach([Lesson("a near request", "x", "s", 4)]
                      + ([Lesson("a far request", "t2", "s", 2)] if t2_taught else []))
        channel.memory.calibration = Calibration(by_similarity=np.full(SIM_BINS, cautious),
                                                 by_nearest=np.full(SIM_BINS, 0.7), by_rank=by_rank)
        lifted = channel.lifts(["task"], lambda t: True, lambda t: None)[0]["x"]
        assert (lifted.probability, lifted.cautious) == (0.7, cautious if cautious >= CAUTIOUS_GATE else 0.0)
        assert list(channel.rank(["task"], base, 4, lambda t: True, lambda t: None)[0][0]) == want
    assert GATE <= 0.35 < CAUTIOUS_GATE <= 0.45


class _Angles:
    """Requests "one", "two", ... at growing angles from the task: "one" is the nearest."""

    name, dim, case_blind = "angles", 2, True
    ORDER = ("one", "two", "three", "four")

    def tasks(self, queries):
        return np.tile(np.asarray([[1.0, 0.0]], dtype=np.float32), (len(queries), 1))

    def requests(self, texts):
        angles = [0.1 * (1 + self.ORDER.index(t)) for t in texts]
        return np.asarray([[np.cos(a), np.sin(a)] for a in angles], dtype=np.float32)


def test_only_the_three_nearest_tools_may_pass_a_tool_nobody_taught():
    """The cautious table counted each anchor's three nearest tools: a, b and c (cautious 0.5) pass u1 (0.45),
    which nobody taught; d, the fourth, has no cautious probability and stays below it."""
    channel = LearnedChannel(_Angles())
    channel.teach([Lesson(request, tool, "s", 2) for request, tool in zip(_Angles.ORDER, "abcd")])
    channel.memory.calibration = Calibration(by_similarity=np.full(SIM_BINS, 0.5), by_nearest=np.full(SIM_BINS, 0.9),
                                             by_rank=np.asarray([0.45] + [0.1] * 4 + [0.0] * 9))
    base = Results((np.asarray(["u1", "a", "b", "c", "d"], dtype=object),), (np.asarray([5.0, 4.0, 3.0, 2.0, 1.0]),))
    assert list(channel.rank(["task"], base, 5, lambda t: True, lambda t: None)[0][0]) == ["a", "b", "c", "u1", "d"]


def test_a_tool_only_learning_knows_enters_below_what_the_untaught_ranking_is_surer_of():
    channel = LearnedChannel(_Space())
    channel.teach([Lesson("a near request", "new", "s", None)])
    channel.memory.calibration = Calibration(by_similarity=np.full(SIM_BINS, 0.45), by_nearest=np.full(SIM_BINS, 0.45),
                                             by_rank=np.asarray([0.6, 0.5, 0.3] + [0.0] * 11))
    base = Results((np.asarray(["u1", "u2", "u3"], dtype=object),), (np.asarray([4.0, 3.0, 2.0]),))
    ids, scores = channel.rank(["task"], base, 3, lambda t: True, lambda t: None)[0]
    assert list(ids) == ["u1", "u2", "new"] and scores[2] <= scores[1]
    ids, _ = channel.rank(["task"], base, 3, lambda t: t != "new", lambda t: None)[0]  # filtered out
    assert list(ids) == ["u1", "u2", "u3"]


def test_evidence_older_than_a_tool_never_lifts_a_tool_above_it():
    """x's evidence was taught at time 10; u2 joined the catalog at 20, so that evidence never weighed x
    against u2: x may pass u1 (there before) but not u2, which the untaught ranking put above it."""
    channel = LearnedChannel(_Space())
    channel.teach([Lesson("a near request", "x", "s", 4, time=10.0)])
    channel.memory.calibration = Calibration(by_similarity=np.full(SIM_BINS, 0.9), by_nearest=np.full(SIM_BINS, 0.9),
                                             by_rank=np.asarray([0.6, 0.4, 0.3, 0.1] + [0.0] * 10))
    base = Results((np.asarray(["u1", "u2", "u3", "x"], dtype=object),), (np.asarray([4.0, 3.0, 2.0, 1.0]),))
    assert list(channel.rank(["task"], base, 4, lambda t: True, lambda t: None)[0][0]) == ["x", "u1", "u2", "u3"]
    channel.tools_joined(["u2"], 20.0)
    assert list(channel.rank(["task"], base, 4, lambda t: True, lambda t: None)[0][0]) == ["u1", "u2", "x", "u3"]
    channel.tools_joined(["u2"], 5.0)  # joined before the evidence: weighed against it
    assert list(channel.rank(["task"], base, 4, lambda t: True, lambda t: None)[0][0]) == ["x", "u1", "u2", "u3"]


# ------------------------------------------------------------------------------------ what a request teaches

def test_numbers_quotes_and_addresses_are_not_what_a_request_teaches():
    assert teachable("Remind me at 9:30am to call 555-0134") == "Remind me at to call"
    assert teachable("Open https://x.org/a/b and mail bob@example.com the file /tmp/a/b.txt") == "Open and mail the file"
    assert teachable('Search GitHub issues for "crash on start"') == "Search GitHub issues for"
    assert teachable("Remember that Alice likes tea") == "Remember that Alice likes tea"  # names say what, too
    assert teachable("42") == "42"  # nothing left: the request as it came (what older records were kept under)
    assert not teaches_anything("42 10:47 2026-11-11") and not teaches_anything("https://a.org/b/c 3.5%")
    assert teaches_anything("call 555-0134") and teaches_anything('"Summarize this page for me"')  # quoted whole


def test_requests_that_differ_in_numbers_only_teach_one_thing(encoder):
    channel = ToolScout.from_tools(WEATHERISH, encoder=encoder).learning
    assert channel.key("Remind me at 9:30 to call 555-0134") == channel.key("remind me at 11:15 to call 555-9876")


def test_a_task_just_searched_teaches_with_the_vector_its_search_made(encoder, monkeypatch):
    """The default encoder ignores letter case, so a request is embedded as written: the task an agent searched
    before using a tool costs no second encoding, and its vector is its key's (lowercased) all the same."""
    assert encoder.case_blind
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    task = "Send Bob An Email About The Quarterly Sales Figures"
    scout.search(task, k=3)
    encoded, encode = [], encoder._encode_queries
    monkeypatch.setattr(encoder, "_encode_queries", lambda queries: encoded.extend(q.text for q in queries) or encode(queries))
    scout.learn([FeedbackEvent(task, ("mail.send",), "agent")])
    assert encoded == []
    memory = scout.learning.memory
    as_key = scout.learning.space.requests([scout.learning.key(task)])[0]  # what embedding the key itself gives
    np.testing.assert_array_equal(memory.vectors[memory.row_of[scout.learning.key(task)]], as_key)


class _CaseReading:
    """A space that reads case: every text embedded is kept, so a test sees what was embedded."""

    name, dim, case_blind = "cased", 2, False

    def __init__(self):
        self.embedded = []

    def tasks(self, queries):
        return np.tile(np.asarray([[1.0, 0.0]], dtype=np.float32), (len(queries), 1))

    def requests(self, texts):
        self.embedded.extend(texts)
        return np.asarray([[1.0, 0.0] if t[0].isupper() else [0.0, 1.0] for t in texts], dtype=np.float32)


def test_a_space_that_reads_case_embeds_the_key_whichever_spelling_came_first():
    first, second = LearnedChannel(_CaseReading()), LearnedChannel(_CaseReading())
    spellings = [Lesson("Send Mail to Bob at 9:30", "mail.send", "a", 1), Lesson("send mail to bob at 11", "mail.send", "b", 1)]
    first.teach(spellings)
    second.teach(spellings[::-1])
    assert first.space.embedded == second.space.embedded == ["send mail to bob at"]
    np.testing.assert_array_equal(first.memory.vectors[:1], second.memory.vectors[:1])


def test_a_tokenizer_is_case_blind_only_when_it_lowercases():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from toolscout.encoders.onnx_runtime import CASE_PROBE, same_tokens

    vocab = {w: i for i, w in enumerate(dict.fromkeys(["[UNK]", *CASE_PROBE.split(), *CASE_PROBE.lower().split()]))}

    def tokenize(lowercase: bool):
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        if lowercase:
            tokenizer.normalizer = normalizers.Lowercase()
        return lambda text: tokenizer.encode(text).ids

    assert same_tokens(tokenize(lowercase=True)) and not same_tokens(tokenize(lowercase=False))


def test_names_and_numbers_in_a_request_do_not_move_other_tasks(taught, encoder):
    """The memory tool taught by requests about people (names, numbers and all): a task that only shares a
    name or a number with them ranks as it would untaught."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    untaught = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    people = [f"remember that {who} {what}" for who, what in itertools.product(
        ["Alice", "Bob", "my aunt Rosa", "Dr. Chen"], ["likes tea", "was born in 1984", "lives at 12 Elm Street",
                                                       "prefers calls after 6pm", "is allergic to nuts"])]
    scout.learn(traffic(people, "memory.store", 20) + background(12, start=500.0))
    for task in ["send Alice an email", "email Bob the 1984 report", "what is the weather at 6pm in Rosa's town"]:
        assert scout.retrieve([task], 8).as_lists() == untaught.retrieve([task], 8).as_lists(), task
    assert scout.search("remember that Carol likes coffee", k=1)[0].tool.id == "memory.store"


def test_a_request_of_numbers_dates_and_addresses_alone_teaches_nothing(encoder):
    """One source's calls whose tasks were only a phone number, a time and a date lifted their tool for tasks
    made of numbers (a user trial: a sake guide first for "call 555-0199 at 10:45"). Such a request is recorded
    and counted, and teaches nothing; a request with words beside its numbers still teaches its words."""
    base = traffic(RAIN, "advice.umbrella", 30) + background()
    scout, plain = ToolScout.from_tools(WEATHERISH, encoder=encoder), ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(base)
    plain.learn(base)
    numbers = [FeedbackEvent(f"{500 + i}-01{i:02d} {i % 12 + 1}:{10 + i} 2026-11-{10 + i}", ("advice.umbrella",),
                             "one-agent", time=900.0 + i) for i in range(30)]
    numbers.append(FeedbackEvent("https://example.org/a/b 42", ("advice.umbrella", "files.read"), "one-agent",
                                 time=950.0))
    result = scout.learn(numbers)
    assert (result.learned, result.incidental, result.failures) == ([], 32, 0)  # 30 pairs, and 2 for the last
    assert scout.ledger.events == plain.ledger.events + 31
    assert scout.learning.report()["requests"] == plain.learning.report()["requests"]
    for task in ["call 555-0199 at 10:45", "12345", "2026-12-01 09:30", "will I need a raincoat on Sunday"]:
        assert scout.retrieve([task], 8).as_lists() == plain.retrieve([task], 8).as_lists(), task
    assert scout.learn([FeedbackEvent("read the file 2026-11-11.txt", ("files.read",), "one-agent",
                                      time=990.0)]).learned


# ------------------------------------------------------------------------------------ the pipeline

WEATHERISH = [
    Tool("weather.forecast", "get_forecast", "Weather forecast for a city: temperature, rain and wind for the "
         "coming days.", namespace="weather"),
    Tool("weather.now", "current_weather", "Current temperature and conditions at a place.", namespace="weather"),
    Tool("advice.umbrella", "packing_advisor", "Tells you what to take along on a trip.", namespace="advice"),
    Tool("mail.send", "send_email", "Send an email message to a recipient.", namespace="mail"),
    Tool("mail.search", "search_inbox", "Find emails in the inbox matching words.", namespace="mail"),
    Tool("calendar.create", "create_event", "Create a calendar event with a title and a start time.",
         namespace="calendar"),
    Tool("files.read", "read_file", "Read a text file from disk.", namespace="files"),
    Tool("memory.store", "create_entities", "Remember facts about people and things for later.", namespace="memory"),
]
def traffic(requests, tool, n, source="agent", start=0.0):
    return [FeedbackEvent(q, (tool,), source, time=start + i) for i, q in enumerate(requests[:n])]


def background(n=12, source="agent", start=100.0):
    """Traffic for four more tools: a calibration needs several taught tools before similarity earns anything."""
    return (traffic(MAIL, "mail.send", n, source, start) + traffic(CALENDAR, "calendar.create", n, source, start + 100)
            + traffic(FILES, "files.read", n, source, start + 200) + traffic(FACTS, "memory.store", n, source, start + 300))


@pytest.fixture(scope="module")
def taught(encoder):
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    untaught = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(traffic(RAIN, "advice.umbrella", 50) + background())
    return scout, untaught


def test_learning_lifts_the_taught_tool_for_tasks_like_the_taught_ones(taught):
    scout, untaught = taught
    task = "will I need a raincoat on Sunday"
    assert untaught.search(task, k=3)[0].tool.id != "advice.umbrella"
    assert scout.search(task, k=3)[0].tool.id == "advice.umbrella"


@pytest.mark.parametrize("task", ["read the notes file on disk", "what is the temperature in Paris right now",
                                  "put a dentist appointment in my calendar", "find the email from the bank"])
def test_tasks_unlike_the_taught_ones_rank_exactly_as_untaught(taught, task):
    scout, untaught = taught
    assert scout.retrieve([task], 8).as_lists() == untaught.retrieve([task], 8).as_lists()


def test_a_tool_added_after_learning_is_found_as_in_an_untaught_index(taught, encoder):
    scout, untaught = taught
    new = Tool("translate.text", "translate", "Translate text into another language.", namespace="translate")
    copy = ToolScout.from_tools(WEATHERISH, encoder=encoder)  # taught exactly as `scout` was
    copy.learn(traffic(RAIN, "advice.umbrella", 50) + background())
    copy.add([new])
    fresh = ToolScout.from_tools(WEATHERISH + [new], encoder=encoder)
    for task in ["translate this sentence into German", "how do you say good morning in Italian"]:
        assert copy.search(task, k=1)[0].tool.id == "translate.text"
        assert copy.retrieve([task], 9).as_lists() == fresh.retrieve([task], 9).as_lists()


def test_a_tool_like_the_taught_ones_added_after_learning_keeps_its_untaught_place(taught, encoder):
    """A new tool that does what the taught one does: the evidence predates it, so learning never pushes it
    below where an untaught index that always had it puts it."""
    scout, _untaught = taught
    copy = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    copy.learn(traffic(RAIN, "advice.umbrella", 50) + background())
    rival = Tool("advice.rain", "rain_kit_advisor", "Says whether to take an umbrella or a raincoat today.",
                 namespace="advice")
    copy.add([rival])
    fresh = ToolScout.from_tools(WEATHERISH + [rival], encoder=encoder)
    tasks = ["will I need a raincoat on Sunday", "should I take my umbrella to work", "rain gear for tonight?"]
    for task in tasks:
        learned, plain = copy.retrieve([task], 9).as_lists()[0], fresh.retrieve([task], 9).as_lists()[0]
        assert learned.index("advice.rain") <= plain.index("advice.rain"), task
    # a channel taught afresh (`relearn`, as /admin/learn does; a PostgreSQL replica that follows its database
    # from a new start) still knows when the tool joined: it forgot, and pushed the rival down
    rankings = copy.retrieve(tasks, 9).as_lists()
    copy.relearn()
    assert copy.retrieve(tasks, 9).as_lists() == rankings


def test_every_event_is_scored_before_it_is_learned_as_a_replay_by_hand_finds(encoder):
    """The scorecard's figures against an independent replay through the public search: for each event, the
    used tool's rank in what `search` served just before it was learned, and in an untaught index."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    untaught = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    events = background(6) + traffic(RAIN, "advice.umbrella", 40, start=1000.0)
    served, plain = [], []
    for event in events:
        served.append(_rank(scout, event))
        plain.append(_rank(untaught, event))
        scout.learn([event])
    report = scout.learning_report()["measured"]
    for name, ranks in (("served", served), ("untaught", plain)):
        assert report["all"][name]["mrr"] == pytest.approx(round(sum(1 / r for r in ranks if r) / len(ranks), 4))
        assert report["all"][name]["top1"] == pytest.approx(round(sum(r == 1 for r in ranks) / len(ranks), 4))
        assert report["all"][name]["top5"] == pytest.approx(round(sum(1 for r in ranks if r and r <= 5) / len(ranks), 4))
    assert served != plain  # learning changed what was served along the way
    advice = report["namespaces"]["advice"]
    assert advice["all"]["events"] == 40 and advice["new_tools"]["events"] == 1  # only the first was untaught


def _rank(scout, event):
    ids = [h.tool.id for h in scout.search(event.query, k=len(WEATHERISH), match_names=False)]
    return ids.index(event.tool_ids[0]) + 1 if event.tool_ids[0] in ids else None


def test_learning_made_worse_on_purpose_turns_its_weight_down_and_says_so(encoder, caplog):
    """Agents change their minds: "umbrella" tasks that taught the advisor now use the forecast. Learning
    at full weight keeps lifting the advisor, so recent events rank the tool actually used lower than the
    untaught ranking does. The weight that goes down by itself is the advisor's namespace's, whose lifts
    passed the forecast (it was the forecast's, which switched off the forecast's own lift and kept the
    advisor's), and that is logged and reported."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(traffic(RAIN, "advice.umbrella", 60) + background())
    assert scout.learning.weight("advice") == 1.0
    task = "will I need a raincoat on Sunday"
    assert scout.search(task, k=1)[0].tool.id == "advice.umbrella"
    with caplog.at_level("WARNING"):
        for i, event in enumerate(traffic(RAIN, "weather.forecast", 60, source="agent-2", start=1000.0)):
            scout.learn([event])
    assert scout.learning.weight("advice") < 1.0 and scout.learning.weight("weather") == 1.0
    assert "learning in namespace 'advice': weight 1.00 ->" in caplog.text
    weights = scout.learning_report()["weights"]
    assert weights["advice"]["how"] == "automatic" and weights["advice"]["weight"] < 1.0
    assert scout.search(task, k=1)[0].tool.id == "weather.forecast"  # what the agents use now


def test_repeats_of_learned_requests_served_perfectly_do_not_hide_harm_to_new_ones(encoder):
    """The switch above, while the agents keep repeating the requests that taught the advisor: each repeat
    ranks the advisor first by what its earlier copy taught (a gain over the untaught ranking), and there are
    six times as many of them as new requests. Counted in, they outweighed the losses and the advisor's
    weight stayed at 1; the weight reads first-seen requests, so it still goes down, and the report shows
    the repeats apart (trial 10, finding 2)."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(traffic(RAIN, "advice.umbrella", 60) + background())
    for i, event in enumerate(traffic(RAIN, "weather.forecast", 60, source="agent-2", start=1000.0)):
        scout.learn([event])
        if i % 10 == 9:  # the old requests again, each still served the advisor
            scout.learn(traffic(RAIN, "advice.umbrella", 60, source=f"repeat-{i}", start=2000.0 + i))
    assert scout.learning.weight("advice") < 1.0
    advice = scout.learning_report()["measured"]["namespaces"]["advice"]
    assert advice["repeats"]["events"] == 360 and advice["first_seen"]["events"] == 60
    assert advice["repeats"]["learned"]["mrr"] > advice["repeats"]["untaught"]["mrr"]  # what hid the harm
    assert advice["all"]["events"] == advice["first_seen"]["events"] + advice["repeats"]["events"]
    assert advice["weighed"]["learned"]["mrr"] < advice["weighed"]["untaught"]["mrr"]


def test_a_namespace_judged_only_through_the_tools_its_lifts_passed_is_reported_with_its_weight():
    """Sixty events of 'weather' tools that learning moved from rank 1 to 3, each passed by an 'ads' tool:
    'ads' has no record of its own, yet its weight goes to 0 (a loss of 0.67 in mean reciprocal rank, far
    beyond the 0.05 that turns it off) and the report lists it; 'weather' keeps full weight."""
    from toolscout.learning.scorecard import Scorecard

    card = Scorecard([Scored(float(i), "s", "weather", "weather.now", f"task {i}", True, 3, 1, 3, ("ads",))
                      for i in range(60)])
    assert card.weights() == {"ads": 0.0, "weather": 1.0}
    report = card.report()["namespaces"]
    assert report["ads"]["automatic_weight"] == 0.0 and report["ads"]["all"]["events"] == 0
    assert report["weather"]["automatic_weight"] == 1.0 and report["weather"]["all"]["events"] == 60
    # what the weight read is shown beside it: ads's 60 losses (1/3 learned vs 1 untaught), none of weather's
    assert report["ads"]["weighed"]["events"] == 60 and report["ads"]["weighed"]["learned"]["mrr"] == 0.3333
    assert report["weather"]["weighed"]["events"] == 0


def test_the_records_each_weight_reads_are_its_last_first_seen_window_as_a_filter_of_all_finds_them():
    """One pass collects every namespace's window (the weights are refreshed after each batch learned, and
    a pass per namespace cost a second at 100,000 records); the oracle filters all records per namespace."""
    from toolscout.learning.scorecard import WINDOW, Scorecard, answers_for

    rng = random.Random(7)
    records = []
    for i in range(3 * WINDOW):
        ns, untaught, learned = rng.choice("abc"), rng.randrange(1, 6), rng.randrange(1, 6)
        passers = tuple(sorted(set(rng.sample("abcd", rng.randrange(1, 3))))) if learned > untaught else ()
        query = f"Task {rng.randrange(WINDOW)}"  # about one in three repeats a request scored for its tool
        records.append(Scored(float(i), "s", ns, f"{ns}.t", rng.choice((query, query.lower() + " ")), True,
                              learned, untaught, learned, passers))
    windows = Scorecard(records).answered_for()
    assert set(windows) == set("abcd")
    seen, first = set(), []
    for r in records:  # the oracle's repeats: the same tool and request (case and spaces aside) seen before
        first.append((r.tool, r.query.strip().lower()) not in seen)
        seen.add((r.tool, r.query.strip().lower()))
    assert 0 < sum(first) < len(records)
    for ns, found in windows.items():  # first-seen records only (meaning changed: repeats no longer read)
        assert found == [r for r, f in zip(records, first) if f and ns in answers_for(r)][-WINDOW:], ns


def test_losses_scored_before_scores_kept_who_passed_the_tool_turn_no_weight_down():
    """Records from before `passed_by` (an upgraded directory or database) say nothing of who passed the
    tool; charged to its own namespace, as the old rule did, they kept that namespace at 0 after the upgrade."""
    from toolscout.learning.scorecard import Scorecard

    old = [Scored(float(i), "s", "weather", "weather.now", f"task {i}", True, 3, 1, 3) for i in range(60)]
    assert Scorecard(old).weights() == {"weather": 1.0}
    gains = [Scored(float(i), "s", "weather", "weather.now", f"task {i}", True, 1, 3, 1) for i in range(60)]
    assert Scorecard(old + gains).weights() == {"weather": 1.0}


def test_a_burst_of_one_tools_traffic_lifts_it_for_no_task(encoder):
    """Requests of one tool alone are all near each other: a calibration from them cannot tell similarity
    from "everything is that tool", so nothing is lifted until several tools are taught."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    untaught = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    scout.learn(traffic(RAIN, "advice.umbrella", 80))
    tasks = ["will I need a raincoat on Sunday", "is it going to rain in Oslo", "pack for a rainy weekend"]
    assert scout.retrieve(tasks, 8).as_lists() == untaught.retrieve(tasks, 8).as_lists()


ASSISTANT_TOOLS = [  # a young deployment's catalog: a few servers' tools, each said in one line
    ("system.print_env", "Print the value of an environment variable"), ("system.echo", "Echo back the text it is given"),
    ("time.now", "Get the current time in a timezone"), ("time.convert", "Convert a time from one timezone to another"),
    ("mail.send_email", "Send an email message to a recipient with a subject and body"),
    ("mail.search_emails", "Search email messages by sender, subject or keyword"),
    ("mail.delete_email", "Delete an email message by its id"), ("mail.forward_email", "Forward an email to another address"),
    ("calendar.create_event", "Create a calendar event with a title, start and end time"),
    ("calendar.list_events", "List upcoming calendar events in a date range"),
    ("calendar.find_free_slot", "Find a free time slot in the calendar for a meeting"),
    ("files.move_file", "Move or rename a file"), ("files.read_file", "Read the contents of a text file"),
    ("files.write_file", "Write text contents to a file, replacing it"),
    ("files.list_directory", "List the files and folders in a directory"), ("files.delete_file", "Delete a file from disk"),
    ("travel.search_flights", "Search for flights between two airports on a date"),
    ("travel.book_hotel", "Book a hotel room in a city for given dates"),
    ("travel.reserve_table", "Reserve a table at a restaurant for a number of people"),
    ("travel.rent_car", "Rent a car at a location for a period"),
    ("finance.stock_price", "Get the latest stock price for a ticker symbol"),
    ("finance.convert_currency", "Convert an amount of money from one currency to another")]
FIRST_CALLS = {  # each tool's first few requests, as a deployment's first day brings them
    "travel.book_hotel": ["book a hotel in Lisbon for the weekend", "find me a room in a hotel near the station",
                          "I need accommodation in Madrid for three nights", "reserve a hotel room downtown"],
    "travel.reserve_table": ["reserve a table for dinner tonight", "book a restaurant for four people",
                             "get us a table at an italian place", "make a dinner reservation for saturday"],
    "mail.search_emails": ["find the email from my accountant", "look for messages about the invoice",
                           "search my mail for the flight confirmation", "which emails mention the contract"],
    "finance.convert_currency": ["how many euros is that in dollars", "change pounds into yen",
                                 "convert my budget to swiss francs", "currency conversion from CAD to USD"],
    "calendar.list_events": ["what's on my agenda this week", "show my upcoming appointments",
                             "list my meetings for tomorrow", "what events do I have on friday"],
    "files.write_file": ["save this text into a file", "write the summary to report.md",
                         "overwrite the notes file with this", "store this output in a text file"]}


@pytest.mark.parametrize("task", ["print an environment variable", "rent a car in Rome"])
def test_a_few_tools_first_requests_push_no_tool_nobody_taught_down_on_tasks_unlike_them(encoder, task):
    """Four requests each for six tools, each tool's requests near one another and far from the others':
    leave-one-out alone saw only requests whose tools were taught, and read a middling similarity as the same
    tool (an environment variable's task lifted `write_file` over `echo`, a car's `reserve_table` over
    `book_hotel`'s neighbours). Playing each taught request as a task of a tool nobody taught holds it back."""
    tools = [Tool(id=i, name=i.split(".")[1], namespace=i.split(".")[0], description=d) for i, d in ASSISTANT_TOOLS]
    scout, untaught = ToolScout.from_tools(tools, encoder=encoder), ToolScout.from_tools(tools, encoder=encoder)
    for t, (tool, requests) in enumerate(FIRST_CALLS.items()):
        scout.learn([FeedbackEvent(q, (tool,), "agent", time=100.0 * t + i) for i, q in enumerate(requests)])
    assert scout.learning_report()["tools_taught"] == len(FIRST_CALLS)  # every event was learned
    assert scout.retrieve([task], 8).as_lists() == untaught.retrieve([task], 8).as_lists()


def test_a_rollback_restores_the_rankings_of_that_time_exactly(encoder):
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    tasks = ["will I need a raincoat on Sunday", "email Sam about lunch", "read a file", "weather in Rome"]
    scout.learn(traffic(RAIN, "advice.umbrella", 40) + background(8))
    at_noon = scout.retrieve(tasks, 8).as_lists()
    report_at_noon = scout.learning_report()
    later = scout.learn(traffic(MAIL, "mail.send", 30, start=5000.0) + traffic(RAIN, "weather.now", 30, "b", start=5000.0))
    assert scout.retrieve(tasks, 8).as_lists() != at_noon
    assert len(scout.rollback(5000.0)) == len(later.learned)
    assert scout.retrieve(tasks, 8).as_lists() == at_noon
    assert scout.learning_report() == report_at_noon


def test_taking_back_newer_evidence_restores_the_place_of_a_tool_that_joined_in_between(encoder, tmp_path):
    """Source a teaches the advisor, a rival joins at 500, source b teaches the same requests at 1000 (now
    weighed against the rival). Forgetting b, or rolling back to 1000, must rank as before b posted: the
    entry's last time taught went back too (it stayed at 1000, so a's older evidence passed the rival)."""
    rival = Tool("advice.rain", "rain_kit_advisor", "Says whether to take an umbrella or a raincoat today.",
                 namespace="advice")
    tasks = ["will I need a raincoat on Sunday", "should I take my umbrella to work", "rain gear for tonight?",
             "do I need an umbrella today"]

    def taught(with_b: bool) -> ToolScout:
        scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
        scout.learn(traffic(RAIN, "advice.umbrella", 50, "a") + background(12, "a"))
        scout.add([rival], when=500.0)
        if with_b:
            scout.learn(traffic(RAIN, "advice.umbrella", 50, "b", start=1000.0))
        return scout

    before_b = taught(False).retrieve(tasks, 9).as_lists()
    forgot, rolled_back = taught(True), taught(True)
    forgot_before = forgot.retrieve(tasks, 9).as_lists()
    assert forgot_before != before_b  # b's newer evidence lifts the advisor past the rival
    forgot.forget("b")
    rolled_back.rollback(1000.0)
    assert forgot.retrieve(tasks, 9).as_lists() == before_b
    assert rolled_back.retrieve(tasks, 9).as_lists() == before_b
    # a directory saved in format 1 (one time and rank per request and tool, as toolscout wrote it before)
    # is taught again from its ledger when it loads, so taking b back restores the ranking there too
    folder = tmp_path / "idx"
    taught(True).save(folder)
    as_format_1(folder / (folder / "CURRENT").read_text().strip() / "learning")
    old = ToolScout.load(folder)
    assert old.retrieve(tasks, 9).as_lists() == forgot_before
    old.forget("b")
    assert old.retrieve(tasks, 9).as_lists() == before_b


def as_format_1(learning: "Path") -> None:
    """Rewrite a saved learned channel as format 1 stored it: per request and tool, the first lesson's
    untaught rank, the last time taught and a count per source."""
    import json

    memory = json.loads((learning / "memory.json").read_text())
    rows = []
    for key, tool, sources in memory["taught"]:
        lessons = sorted((when, source, rank) for source, taught in sources.items() for when, rank in taught)
        rows.append([key, tool, lessons[0][2], lessons[-1][0], {s: len(t) for s, t in sources.items()}])
    memory["taught"] = rows
    (learning / "memory.json").write_text(json.dumps(memory))
    config = json.loads((learning / "config.json").read_text())
    (learning / "config.json").write_text(json.dumps({**config, "format_version": 1}))


def test_forgetting_every_source_restores_the_untaught_ranking_bit_for_bit(taught, encoder):
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    before = scout.retrieve(["will I need a raincoat on Sunday", "email Sam"], 8)
    scout.learn(traffic(RAIN, "advice.umbrella", 40, "a") + background(10, "b"))
    assert scout.forget("a") == ["advice.umbrella"]
    assert scout.forget("b") == ["calendar.create", "files.read", "mail.send", "memory.store"]
    after = scout.retrieve(["will I need a raincoat on Sunday", "email Sam"], 8)
    assert after.as_lists() == before.as_lists()
    assert all(np.array_equal(a, b) for a, b in zip(after.scores, before.scores))


def test_freeze_records_but_does_not_learn_until_unfrozen(encoder):
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    task = "will I need a raincoat on Sunday"
    before = scout.retrieve([task], 8).as_lists()
    scout.set_learning(freeze=True, when=0.0)
    scout.learn(traffic(RAIN, "advice.umbrella", 50, start=10.0) + background())
    assert scout.retrieve([task], 8).as_lists() == before and scout.ledger.summary("advice.umbrella")["learned"] == 50
    scout.set_learning(freeze=False)
    assert scout.search(task, k=1)[0].tool.id == "advice.umbrella"


def test_the_channel_and_its_measurements_survive_a_save(taught, tmp_path):
    scout, _untaught = taught
    scout.save(tmp_path / "idx")
    loaded = ToolScout.load(tmp_path / "idx")
    tasks = ["will I need a raincoat on Sunday", "email Sam about lunch"]
    assert loaded.retrieve(tasks, 8).as_lists() == scout.retrieve(tasks, 8).as_lists()
    assert loaded.learning_report() == scout.learning_report()


def test_a_pipeline_without_an_encoder_learns_in_hashed_word_space():
    scout = ToolScout.from_tools(WEATHERISH, retriever="bm25")
    assert isinstance(scout.learning.space, HashedSpace)
    task = "do I need my umbrella today"
    assert "advice.umbrella" not in scout.retrieve([task], 8).as_lists()[0]  # it shares no word with the task
    scout.learn(traffic(RAIN, "advice.umbrella", 60) + background())
    assert scout.search(task, k=1)[0].tool.id == "advice.umbrella"


def test_the_calibration_counts_each_anchors_nearest_tools_as_brute_force_does():
    """The leave-one-out counts the calibration is fitted on, computed for all anchors at once, equal a
    brute-force count: for each anchor request, each tool's best similarity to that tool's other requests,
    its three nearest tools (ties by id), each a trial in its similarity bin and a hit if the anchor taught it;
    the nearest request's tools (two tools of one request tie) counted again in the nearest table; also
    after requests are forgotten and anchors change."""
    from toolscout.learning import memory as mem

    rng = np.random.default_rng(7)
    memory = mem.RequestMemory(dim=16)
    tools = [f"t{i:02d}" for i in range(FEW_TOOLS + 10)]  # more than a few: new tools' misses weigh less
    items = []
    for i in range(900):  # more requests than anchors
        vector = rng.normal(size=16).astype(np.float32)
        for tool in rng.choice(tools, size=int(rng.integers(1, 3)), replace=False):
            items.append((f"request {i}", vector / np.linalg.norm(vector), str(tool), "s", int(rng.integers(1, 30)), 0.0))
    memory.add(items[:400])
    memory.add(items[400:])

    assert len(memory.anchors) == mem.ANCHORS and memory.calibration.to_dict() == brute_calibration(memory).to_dict()
    memory.remove([(key, tool, None, None) for key in memory.anchors[:40] for tool in list(memory.taught[key])])
    assert memory.calibration.to_dict() == brute_calibration(memory).to_dict()


def test_the_share_of_the_catalog_nobody_taught_weighs_a_new_tools_misses_whenever_the_size_became_known():
    """Traffic confined to a part of the catalog says a request almost never needs a new tool; the share of
    the catalog's tools nobody taught says otherwise, and the cautious table counts a new tool's misses at
    the larger of the two, as brute force does. The calibration is a function of what is held and of the
    catalog's size: a size known before the lessons and one learned after them give the same tables, a
    catalog that grows refits them, and an unknown size is the traffic's share alone."""
    memory, _base = churned_memory()
    traffic_only = memory.calibration.to_dict()
    tools = len(memory.rows_of_tool)
    memory.set_catalog_size(4 * tools)  # three quarters of the catalog untaught: more than the traffic says
    assert memory._new_tool_share() == pytest.approx(0.75)
    assert memory.calibration.to_dict() == brute_calibration(memory).to_dict() != traffic_only
    cautious, before = memory.calibration.to_dict()["by_similarity"], traffic_only["by_similarity"]
    assert all(now <= then for now, then in zip(cautious, before)) and sum(cautious) < sum(before)  # more cautious
    first = RequestMemory(16)
    first.set_catalog_size(4 * tools)  # known before any lesson
    first.add([(k, memory.vectors[memory.row_of[k]], tool, source, rank, when)
               for k, tools_ in sorted(memory.taught.items()) for tool, entry in tools_.items()
               for source, lessons in entry.lessons.items() for when, rank in lessons])
    assert first.calibration.to_dict() == memory.calibration.to_dict()
    memory.set_catalog_size(8 * tools)  # the catalog grew: the tables follow at once
    assert memory.calibration.to_dict() == brute_calibration(memory).to_dict()
    memory.set_catalog_size(None)
    assert memory.calibration.to_dict() == traffic_only


def test_the_channel_knows_the_catalogs_size_as_it_changes_and_after_a_save(encoder, tmp_path):
    """The pipeline tells its learned channel how many tools the catalog holds: built, grown, shrunk, started
    afresh (a rollback to nothing, a relearning) and loaded again."""
    scout = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    assert scout.learning.memory.catalog_size == len(WEATHERISH)
    scout.learn(traffic(RAIN, "advice.umbrella", 30) + background())
    extra = Tool(id="weather.radar", name="radar", namespace="weather", description="Show the rain radar map")
    scout.add([extra])
    assert scout.learning.memory.catalog_size == len(WEATHERISH) + 1
    grown = scout.learning.calibration.to_dict()
    scout.save(tmp_path / "index")
    loaded = ToolScout.load(tmp_path / "index")
    assert loaded.learning.memory.catalog_size == len(WEATHERISH) + 1
    assert loaded.learning.calibration.to_dict() == grown
    scout.relearn()
    assert scout.learning.memory.catalog_size == len(WEATHERISH) + 1
    assert scout.learning.calibration.to_dict() == grown
    scout.remove(["weather.radar"])
    assert scout.learning.memory.catalog_size == len(WEATHERISH)


def test_an_index_that_replaces_another_keeps_what_it_learned_as_learning_the_kept_events_on_it_gives(encoder):
    """`toolscout index --out` over a learned index (`carry_learning`): the catalog lost one taught tool and
    gained a rival of the taught advisor. The oracle is a fresh index of the new catalog that learns the
    surviving events from scratch: same rankings and scores, same ledger (untaught ranks measured on the new
    catalog, where the rival moved the advisor down), same calibration. The scores of the old events stay,
    the evidence the automatic weights read (every namespace under MIN_EVENTS here, so at full weight in both)."""
    rival = Tool("advice.rain", "rain_kit_advisor", "Says whether to take an umbrella or a raincoat today.",
                 namespace="advice")
    temperatures = [f"{ask} {city} {when}" for ask, city, when in itertools.product(
        ["how warm is it in", "what is the temperature in", "is it cold right now in"], ["Rome", "Oslo", "Lima"],
        ["at the moment", "now"])]
    # six taught tools: five stay, enough for similarity to earn something (MIN_TOOLS)
    events = traffic(RAIN, "advice.umbrella", 40) + background(10) + traffic(temperatures, "weather.now", 12, start=900.0)
    old = ToolScout.from_tools(WEATHERISH, encoder=encoder)
    old.learn(events[:30])
    old.learn(events[30:])
    catalog = [t for t in WEATHERISH if t.id != "memory.store"] + [rival]
    # a weight change the old index went through stays in the history (review: re-indexing dropped it)
    old.learning.weight_history = [{"time": 950.0, "namespace": "advice", "from": 1.0, "to": 0.9, "why": "worse"}]
    new = ToolScout.from_tools(catalog, encoder=encoder)
    assert new.carry_learning(old) == (len(events) - 10, 10)
    assert new.learning.weight_history == old.learning.weight_history
    oracle = ToolScout.from_tools(catalog, encoder=encoder)
    oracle.learn([e for e in events if e.tool_ids != ("memory.store",)])

    tasks = ["will I need a raincoat on Sunday", "should I take my umbrella to work", "rain gear for tonight?",
             "how hot is it in Madrid now", "email Sam about lunch", "read the notes file"]
    got, want = new.retrieve(tasks, 9), oracle.retrieve(tasks, 9)
    assert got.as_lists() == want.as_lists()
    assert all(np.array_equal(a, b) for a, b in zip(got.scores, want.scores))
    untaught = ToolScout.from_tools(catalog, encoder=encoder).retrieve(tasks, 9).as_lists()
    assert [ids[0] for ids in got.as_lists()[:3]] == ["advice.umbrella"] * 3  # what was learned still lifts it
    assert [ids[0] for ids in untaught[:3]] == ["advice.rain"] * 3
    as_taught = [(u.tool_id, u.source, u.query, u.time, u.untaught_rank) for u in new.ledger.taught()]
    assert as_taught == [(u.tool_id, u.source, u.query, u.time, u.untaught_rank) for u in oracle.ledger.taught()]
    assert as_taught != [(u.tool_id, u.source, u.query, u.time, u.untaught_rank) for u in old.ledger.taught()
                         if u.tool_id != "memory.store"]  # the rival changed where the advisor stood untaught
    assert new.learning.calibration.to_dict() == oracle.learning.calibration.to_dict()
    assert new.learning.scorecard.records == [r for r in old.learning.scorecard.records if r.tool != "memory.store"]

"""Chat-transcript tasks: the latest user turn is found, and recent turns weigh more in BM25 and the encoders."""

import numpy as np
import pytest

from toolscout.conversation import emphasise_latest_turn, latest_turn, without_speaker_labels
from toolscout.retrievers.dense import DenseRetriever
from toolscout.tool import Tool

DIALOGUE = ("User: Can you move my dentist appointment to Friday?\n"
            "AI: Done, it is on Friday at 10.\n"
            "User: Also, what will the weather be in Paris tomorrow?\n"
            "AI: Let me look that up.")


def test_latest_turn_is_the_last_user_turn_and_the_replies_after_it():
    assert latest_turn(DIALOGUE) == "User: Also, what will the weather be in Paris tomorrow?\nAI: Let me look that up."
    assert latest_turn("system: be brief\nHUMAN: hi there") == "HUMAN: hi there"  # labels in any case
    assert latest_turn("User: a\r\nAI: b\r\nUser: c\r\n") == "User: c"  # Windows line ends
    assert latest_turn("User: a\nAI: b\nUser: c\nAI: d\nUser:") == "User: c\nAI: d\nUser:"  # last turn with words


@pytest.mark.parametrize("text", [
    "What will the weather be in Paris tomorrow?",  # one request
    "User: book a table for two\nAI: For when?",  # the only user turn opens the text: its tail is the text
    "Find a tool: something for weather",  # a colon, but no speaker label at a line start
    "AI: hello\nAssistant: anything else?",  # no user turn
    "User: book a flight to Paris\nAI: When?\nUser:",  # a template's open `User:` line is not a turn
    "User: book a flight\nAI: When?\nUser:   \nAI: hello?",  # nor is a user turn of blanks
])
def test_texts_that_are_not_multi_turn_transcripts_have_no_latest_turn(text):
    assert latest_turn(text) is None


def test_emphasis_adds_the_tail_vector_and_renormalises():
    vectors = np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    calls = []

    def encode(texts):
        calls.append(texts)
        return np.array([[0.0, 1.0]], dtype=np.float32)

    out = emphasise_latest_turn(vectors, [latest_turn(DIALOGUE), None], encode)
    assert calls == [[latest_turn(DIALOGUE)]]  # only the transcript's tail is encoded
    np.testing.assert_allclose(out[0], [2 ** -0.5, 2 ** -0.5], atol=1e-6)  # (1,0)+(0,1), unit length
    np.testing.assert_array_equal(out[1], vectors[1])  # a plain request is untouched
    np.testing.assert_array_equal(vectors[0], [1.0, 0.0])  # the input is not modified
    assert emphasise_latest_turn(vectors, [latest_turn(DIALOGUE), None], encode, weight=0) is vectors


def test_the_encoder_mixes_the_latest_turn_into_transcript_queries(encoder):
    full, tail = encoder.encode([DIALOGUE, latest_turn(DIALOGUE)])
    expected = (full + tail) / np.linalg.norm(full + tail)
    got = encoder.encode_queries([DIALOGUE, "weather in Paris"])
    np.testing.assert_allclose(got[0], expected, atol=1e-5)
    np.testing.assert_allclose(got[1], encoder.encode(["weather in Paris"])[0], atol=1e-6)


def test_the_encoder_reads_a_long_transcript_by_its_recent_turns(encoder):
    from toolscout.conversation import RECENT_CHARS

    older = ["User: " + "tell me about the weather in Paris and in Rome " * 14, "AI: " + "sunny and warm " * 40]
    assert all(len(turn) > RECENT_CHARS for turn in older)  # neither fits beside the recent turns
    recent = "User: please write an email to my wife\nAI: Sure, what should it say?\nUser: that I will be home late"
    got = encoder.encode_queries(["\n".join(older + [recent])])[0]
    context, tail = encoder.encode([recent, "User: that I will be home late"])
    np.testing.assert_allclose(got, (context + tail) / np.linalg.norm(context + tail), atol=1e-5)


def test_dense_search_on_a_transcript_ranks_the_tool_for_the_latest_request_first(encoder):
    tools = [Tool(id="reschedule", name="reschedule_appointment", description="Move a booked doctor or dentist appointment to another date."),
             Tool(id="weather", name="get_weather_forecast", description="Weather forecast for a city for the coming days.")]
    retriever = DenseRetriever(encoder=encoder)
    retriever.index(tools)
    assert retriever.search([DIALOGUE], k=2).as_lists()[0] == ["weather", "reschedule"]
    encoder.latest_turn_weight = 0  # the whole transcript alone leans to the first request
    try:
        assert retriever.search([DIALOGUE], k=2).as_lists()[0] == ["reschedule", "weather"]
    finally:
        encoder.latest_turn_weight = 1.0


THREE_TURNS = ("System: be brief\n"
               "User: Can you move my dentist appointment to Friday?\n"
               "AI: Done.\n"
               "User: What will the weather be in Paris tomorrow?\n"
               "AI: Sunny.\n"
               "User: Send an email to Ann about it\n"
               "AI: Sent.")


def test_turn_weights_halve_going_back_from_a_latest_turn_that_counts_twice():
    from toolscout.conversation import turn_weights

    assert turn_weights(THREE_TURNS) == [
        (" be brief\n", 0.125),  # a system prompt counts as older than every user turn
        (" Can you move my dentist appointment to Friday?\n Done.\n", 0.25),
        (" What will the weather be in Paris tomorrow?\n Sunny.\n", 0.5),
        (" Send an email to Ann about it\n Sent.", 2.0)]
    # a system prompt listing tools does not weigh as much as the one request after it
    assert turn_weights("System: tools: get_weather\nUser: send an email to Ann") == [
        (" tools: get_weather\n", 0.5), (" send an email to Ann", 2.0)]
    assert turn_weights("send an email to Ann") == [("send an email to Ann", 1.0)]
    assert turn_weights("User: book a table\nAI: For when?") == [("User: book a table\nAI: For when?", 1.0)]


def _bm25_of(tools):
    from toolscout.retrievers.bm25 import BM25Retriever

    retriever = BM25Retriever()
    retriever.index(tools)
    return retriever


def test_bm25_weighs_each_word_of_a_transcript_by_its_turn():
    retriever = _bm25_of([
        Tool(id="reschedule", name="reschedule_appointment", description="Move a dentist appointment to another day."),
        Tool(id="weather", name="get_weather_forecast", description="Weather forecast for a city, like Paris."),
        Tool(id="mail", name="send_mail", description="Send an email.")])
    # each query word adds its term score times its weight, so the three turns' scores add up so weighed
    expected = (0.125 * _plain_scores(retriever, "be brief")
                + 0.25 * _plain_scores(retriever, "Can you move my dentist appointment to Friday? Done.")
                + 0.5 * _plain_scores(retriever, "What will the weather be in Paris tomorrow? Sunny.")
                + 2.0 * _plain_scores(retriever, "Send an email to Ann about it Sent."))
    np.testing.assert_allclose(retriever.scores(THREE_TURNS), expected, rtol=1e-5)
    assert retriever.search([THREE_TURNS], k=1).as_lists()[0] == ["mail"]


WEATHER_TALK = [("what's the weather in Paris?", "The forecast says sunny and 21 degrees, no rain expected."),
                ("and in London tomorrow?", "The forecast says rain in the morning, 14 degrees."),
                ("will it rain in Rome this weekend?", "No rain in the forecast for Rome, sunny and warm.")]


def _after_weather_talk(turns: int, request: str) -> str:
    lines = []
    for i in range(turns):
        asked, answered = WEATHER_TALK[i % len(WEATHER_TALK)]
        lines += [f"User: {asked}", f"AI: {answered}"]
    return "\n".join(lines + [request])


def test_earlier_turns_about_another_task_do_not_outvote_the_latest_request_in_bm25():
    retriever = _bm25_of([Tool(id="weather", name="get_weather", description="Weather forecast and rain for a city."),
                          Tool(id="email", name="send_email", description="Send an email message to a recipient.")])
    request = "User: please send an email to my wife that I will be home late"
    for turns in (0, 3, 6, 12):
        assert retriever.search([_after_weather_talk(turns, request)], k=2).as_lists()[0][0] == "email", turns


def _plain_scores(retriever, text):
    """BM25 scores of `text` with no transcript handling: a bm25s index of the retriever's documents,
    queried directly."""
    import bm25s

    reference = bm25s.BM25(**retriever.params)
    reference.index([t or ["\x00"] for t in retriever.tokens], show_progress=False)
    tokens = [t for t in retriever.tokenizer(text) if t in reference.vocab_dict]
    return reference.get_scores(tokens) if tokens else np.zeros(len(retriever.tokens))  # no word in any tool


def test_focus_keeps_what_search_reads_of_a_long_task():
    from toolscout.conversation import focus

    assert focus("book a flight to Rome") == ("book a flight to Rome", False)
    blob = "A" * 500
    assert focus(f"here is my file {blob} please translate it") == ("here is my file   please translate it", True)
    words = " ".join(f"word{i}" for i in range(1000))  # 8,890 characters
    head, cut = focus(words, limit=60)
    assert cut and head == "word0 word1 word2 word3 word4 word5 word6 word7 word8 word9"  # whole words, from the start
    turns = "\n".join(f"User: request number {i} about {'x' * 40}\nAI: done" for i in range(50))
    tail, cut = focus(turns + "\nUser: now book a hotel in Oslo", limit=200)
    assert cut and tail.endswith("User: now book a hotel in Oslo") and tail.startswith(("User:", "AI:"))  # whole turns
    assert len(tail) <= 200 and "request number 49" in tail and "request number 45" not in tail

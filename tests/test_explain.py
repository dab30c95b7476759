"""`explain`: each hit lists the query's words found in its tool's text view, compared as BM25 terms.

The expected words are worked out by hand from the tools in conftest.py: the query's words are lowercased,
words of one character and bm25s's English stopwords ("the", "and", "to", "a", ...) dropped, and each is
kept when its Snowball stem is a stem of the tool's text view (name words, description, parameters)."""

from toolscout import ToolScout
from toolscout.hits import matched_words
from toolscout.results import Filter
from toolscout.tool import TextView

# query words: sending, messages, emails, colleague, about, flight
# stems:       send,    messag,   email,  colleagu,  about, flight
TASK = "Sending the messages and emails to a colleague about the flight"
EXPECTED = {
    # "send email" / "Send an email message to ..." / "body: Message text"
    "mail.send": ["sending", "messages", "emails"],
    # "Find emails in the inbox matching a text query."
    "mail.search": ["emails"],
    # "Book a seat on a flight found by search_flights." ("search_flights" is one BM25 word)
    "flights.book": ["flight"],
    # "Create a calendar event with a title, start time and attendees.": no word in common
    "calendar.create": [],
}


def test_matched_words_keep_query_words_whose_stem_the_tool_has():
    words, terms = ["booking", "flights", "flight", "hotel"], ["book", "flight", "flight", "hotel"]
    assert matched_words(words, terms, ["flight", "seat", "book"]) == ("booking", "flights", "flight")
    assert matched_words(words, terms, ["flights"]) == ()  # terms are compared stemmed, as BM25 indexes them


def test_pipeline_explains_retrieved_name_and_always_hits(tools):
    scout = ToolScout.from_tools(tools, retriever="bm25")
    within = Filter.make(ids=list(EXPECTED))  # BM25 never retrieves calendar.create: it shares no word
    hits = scout.search(TASK, k=3, filter=within, explain=True, always_include=["calendar.create"])
    assert {h.tool.id: list(h.matched) for h in hits} == EXPECTED
    assert [h.match for h in hits] == ["retrieval"] * 3 + ["always"]
    assert hits[0].to_dict()["matched"] == list(hits[0].matched)

    named = scout.search("send email", k=1, explain=True)[0]
    assert (named.tool.id, named.match, named.matched) == ("mail.send", "name", ("send", "email"))
    # a task's snake_case identifier is read as its words, as the tool's name is indexed ("send email")
    named = scout.search("send_email", k=1, explain=True)[0]
    assert (named.tool.id, named.match, named.matched) == ("mail.send", "name", ("send", "email"))

    repeated = scout.search("Emails, emails and EMAIL", k=1, filter=Filter.make(ids=["mail.send"]), explain=True)
    assert repeated[0].matched == ("emails", "email")  # each word once, as written (lowercased)


def test_without_explain_hits_carry_no_words(tools):
    hit = ToolScout.from_tools(tools, retriever="bm25").search(TASK, k=1)[0]
    assert hit.matched is None and "matched" not in hit.to_dict()


def test_the_words_are_those_the_index_read_through_its_view_and_tokenizer(tools, tmp_path):
    # an index that leaves descriptions out: "emails" is only in search_inbox's description, so it is not
    # a word its text search read; send_email keeps "messages" from its body parameter ("Message text")
    ToolScout.from_tools(tools, retriever="bm25", view=TextView(description=False)).save(tmp_path / "idx")
    scout = ToolScout.load(tmp_path / "idx")
    within = Filter.make(ids=["mail.send", "mail.search"])
    hits = scout.search(TASK, k=1, filter=within, explain=True, always_include=["mail.search"])
    assert {h.tool.id: list(h.matched) for h in hits} == {"mail.send": ["sending", "messages", "emails"],
                                                          "mail.search": []}
    # unstemmed, "sending", "messages" and "emails" are not send_email's "send", "message" and "email"
    unstemmed = ToolScout.from_tools(tools, retriever="bm25", stemmer=None)
    hit = unstemmed.search(TASK, k=1, filter=Filter.make(ids=["mail.send"]), explain=True,
                           always_include=["mail.send"])[0]  # (it shares no word with the task: not ranked)
    assert hit.matched == ()


def test_the_reading_is_the_bm25_parts_else_the_first_view_taken(encoder):
    from toolscout.retrievers.bm25 import BM25Retriever, lexical_reading
    from toolscout.retrievers.dense import DenseRetriever
    from toolscout.retrievers.hybrid import HybridRetriever

    names_only, no_params = TextView(description=False), TextView(parameters=False)
    keyword = BM25Retriever(names_only, stemmer=None)
    dense = DenseRetriever(encoder=encoder, view=no_params)
    for first_stage in (HybridRetriever([keyword, dense]), HybridRetriever([dense, keyword])):
        view, tokenizer = lexical_reading(first_stage)
        assert view == names_only and tokenizer is keyword.tokenizer
    view, tokenizer = lexical_reading(dense)  # no BM25 part: the dense view, BM25's default words
    assert view == no_params and tokenizer.stemmer_name == "english" and tokenizer.stopwords_name == "en"

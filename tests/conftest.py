import os
from pathlib import Path

import pytest

# Nothing in the tests may reach a model hub: the default encoder comes from the installed package.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _threads_per_worker() -> None:
    """Each pytest-xdist worker gets its share of the cores for torch's and BLAS's threads, set before they
    load: with every worker running OpenMP threads on every core, the threads of one worker wait on those
    of another, and the training tests take about twice as long."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from toolscout.defaults import usable_cores  # light: no numpy or torch yet

        share = str(max(1, usable_cores() // workers))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(var, share)


_threads_per_worker()

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(items):
    """Every test that reads ../shared/data carries the `shared` marker (`-m "not shared"` leaves them out)."""
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"needs the shared benchmark data at {SHARED_DATA} (not present in this checkout)")
    return SHARED_DATA


@pytest.fixture
def torch_encoders(monkeypatch):
    """Make `Encoder.load` default to the torch backend. Tests that train models use it: an ONNX export of
    every freshly trained model would only cost time (the export itself is tested in test_encoders.py)."""
    from toolscout.encoders import Encoder

    load = Encoder.load.__func__

    def load_torch(cls, name_or_path=None, device=None, max_seq_length=None, backend="torch", cache_dir=None):
        return load(cls, name_or_path, device=device, max_seq_length=max_seq_length, backend=backend,
                    cache_dir=cache_dir)

    monkeypatch.setattr(Encoder, "load", classmethod(load_torch))


TINY_MODEL_LAYERS = (0, 5)  # MiniLM-L6's first and last layers (the last matters most to its vectors)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The folder of MiniLM-L6 cut to two transformer layers, a sentence-transformers model like any other.
    Why: tests that train, reload or export a model to check what is around it (a loss falls, a directory
    reloads, a pipeline or the CLI passes it on) start from it, at about a third of the six-layer model's
    cost per step. Tests about MiniLM itself (its tensors, the shipped export, its recorded checks) keep it."""
    from sentence_transformers import SentenceTransformer

    from toolscout.encoders import resolve_model
    from toolscout.train.query_student import student_of

    folder = tmp_path_factory.mktemp("tiny-model") / "minilm-2-layers"
    minilm = SentenceTransformer(resolve_model("minilm"), device="cpu")
    student_of(minilm, TINY_MODEL_LAYERS).save(str(folder))
    return str(folder)


@pytest.fixture(scope="session")
def encoder():
    from toolscout.encoders import Encoder

    return Encoder.load(None)


@pytest.fixture
def tools():
    return sample_tools()


def sample_tools():
    """Thirteen tools in six namespaces, each with a small parameter schema (the `tools` fixture; module-scoped
    fixtures call this)."""
    from toolscout.tool import Tool

    def obj(**props):
        return {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()}}

    return [
        Tool("weather.get_forecast", "get_forecast", "Get the weather forecast for a city for the next days.",
             obj(city="Name of the city", days="How many days ahead"), namespace="weather"),
        Tool("weather.get_current", "getCurrentWeather", "Current temperature, wind and rain at a location.",
             obj(location="City or coordinates"), namespace="weather"),
        Tool("flights.search", "search_flights", "Search flights between two airports on a date.",
             obj(origin="Departure airport code", destination="Arrival airport code", date="Travel date"),
             namespace="travel"),
        Tool("flights.book", "book_flight", "Book a seat on a flight found by search_flights.",
             obj(flight_id="Flight identifier", passenger="Passenger full name"), namespace="travel"),
        Tool("hotels.book", "book-hotel-room", "Reserve a hotel room in a city for given nights.",
             obj(city="City", check_in="Arrival date", nights="Number of nights"), namespace="travel"),
        Tool("mail.send", "send_email", "Send an email message to one or more recipients.",
             obj(to="Recipient addresses", subject="Subject line", body="Message text"), namespace="mail"),
        Tool("mail.search", "search_inbox", "Find emails in the inbox matching a text query.",
             obj(query="Words to look for"), namespace="mail"),
        Tool("calendar.create", "create_event", "Create a calendar event with a title, start time and attendees.",
             obj(title="Event title", start="Start time", attendees="People to invite"), namespace="calendar"),
        Tool("calendar.list", "list_events", "List the calendar events between two dates.",
             obj(start="From date", end="To date"), namespace="calendar"),
        Tool("math.convert_currency", "convert_currency", "Convert an amount of money from one currency to another.",
             obj(amount="Amount", source="From currency code", target="To currency code"), namespace="finance"),
        Tool("stocks.quote", "get_stock_quote", "Latest share price of a company by its ticker symbol.",
             obj(ticker="Stock ticker symbol"), namespace="finance"),
        Tool("files.read", "read_file", "Read the contents of a text file from disk.",
             obj(path="File path"), namespace="files"),
    ]

"""Flags several commands share, and what they mean for the objects they build: retriever and
reranker options (from each class's declared settings: `Retriever.accepts`, `Reranker.settings`), the
text-view flags, `-o KEY=VALUE` options, and the LLM connection flags of `expand` and `generate`.

Environment variables are read here (the LLM API key), once, and passed down as values.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..defaults import DEFAULT_RETRIEVER
from ..llm import DEFAULT_KEY_ENV
from ..tool import PROFILE_FIELDS, TextView

# the fast tiers (`encoders/fast.py`), shared by search, eval and serve
FAST_QUERIES_HELP = ("the fast tier: encode tasks with the static table distilled from the index's encoder (the "
                     "cheapest tier and the most quality lost; cost and quality measured in docs/serving.md)")
STUDENT_QUERIES_HELP = ("the middle tier: encode tasks with the four-layer query student distilled from the "
                        "index's encoder (less CPU a task, little quality lost; measured in docs/serving.md)")


FAST_QUERY_FLAGS = {"table": "--fast-queries", "student": "--student-queries"}  # tier -> its flag


def number_in(kind: type, low: float, high: float | None = None):
    """An argparse type: an int or float (`kind`), finite, from `low` (to `high`), so a value out of range is
    refused naming the flag, before anything starts."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < low or (high is not None and value > high):
            span = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}")
        return value

    return parse


def add_fast_queries(parser: argparse.ArgumentParser, *, saved: bool = True) -> None:
    """--fast-queries (the static table) or --student-queries, into `fast_queries` ("table" or "student";
    None: as the index was saved). Two flags, not one option with a value: `--fast-queries DIR` must keep
    reading DIR as DIR. `saved`: the command reads a saved index, so --encoder-queries can override its tier."""
    tiers = parser.add_mutually_exclusive_group()
    for tier, text in (("table", FAST_QUERIES_HELP), ("student", STUDENT_QUERIES_HELP)):
        tiers.add_argument(FAST_QUERY_FLAGS[tier], dest="fast_queries", action="store_const", const=tier,
                           default=None, help=text)
    if saved:
        tiers.add_argument("--encoder-queries", dest="fast_queries", action="store_const", const=False,
                           help="encode tasks with the index's own encoder, even where the index was saved "
                                "with a fast tier (by `toolscout index --fast-queries` or --student-queries)")

# ------------------------------------------------------------------------------------ retrievers

class _OptionOfRetriever(argparse.Action):
    """-o KEY=VALUE among several --retriever flags: kept with how many came before it, so that it goes to
    the one just before it (`retriever_systems`)."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.option = [*namespace.option, (len(namespace.retriever or []), value)]


def add_retriever_options(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    if many:
        p.add_argument("--retriever", action="append", default=None,
                       help=f"retriever to evaluate; repeat to compare several (default: {DEFAULT_RETRIEVER}, "
                            "what `toolscout index` builds)")
        p.add_argument("--option", "-o", action=_OptionOfRetriever, default=[], metavar="KEY=VALUE",
                       help="a setting of the --retriever just before it, as `toolscout index -o` takes (repeatable), "
                            "e.g. --retriever hybrid -o fusion=rrf; the same retriever twice with other settings "
                            "is two systems, named hybrid[fusion=rrf]")
    else:
        p.add_argument("--retriever", default=DEFAULT_RETRIEVER,
                       help="first-stage retriever name (bm25, dense, hybrid, ...); default %(default)s")
    p.add_argument("--model", default=None,
                   help="encoder name or path for encoder-based retrievers, or a `toolscout train` model directory")
    p.add_argument("--store", default="numpy",
                   help="vector store for dense retrievers: numpy (exact) or faiss:FACTORY, e.g. faiss:HNSW32, "
                        "or a PostgreSQL DSN postgresql://... (pgvector; docs/postgres.md)")
    p.add_argument("--no-split", dest="split_requests", action="store_false",
                   help="rank every task as one request (by default a task that holds several requests is "
                        "split and each request's best tools merged in: toolscout.defaults.DEFAULT_INTENTS)")
    add_view_options(p)


def intents_from_args(args: argparse.Namespace) -> Any:
    """The `intents` ToolScout.from_tools gets: its default, or None for --no-split."""
    from ..pipeline import DEFAULT_INTENT_MERGE

    return DEFAULT_INTENT_MERGE if args.split_requests else None


def flags_for_model(model: str, method: str) -> str:
    """The flags that use a model `method` trained: the retrievers it is trained for take it as --model; a
    second stage (cross, refiner) is given as --rerank."""
    from ..retrievers.base import REGISTRY, retriever_class

    names = [name for name in REGISTRY if retriever_class(name).accepts.trained_by == method]
    if names:
        return f"--retriever {' (or '.join(names)}{')' * (len(names) - 1)} --model {model}"
    return f"--rerank {model}"


def model_for(model: str | None, name: str) -> str | None:
    """--model for retriever `name` among several compared ones: a trained model directory goes only to
    the retriever its method trains; a plain encoder name or folder to every retriever that takes a model."""
    from ..models import model_config
    from ..retrievers.base import retriever_class

    accepts = retriever_class(name).accepts
    if model is None or not accepts.model:
        return None
    trained = model_config(model)
    return model if trained is None or trained[1].get("method") == accepts.trained_by else None


def retriever_options(args: argparse.Namespace, name: str, model: str | None) -> dict[str, Any]:
    """Constructor options the flags mean for retriever `name` (`model`: the --model it gets, or None)."""
    from ..retrievers.base import retriever_class

    accepts = retriever_class(name).accepts
    options: dict[str, Any] = {}
    view = view_from_args(args)
    if view is not None:
        if not accepts.view:
            raise ValueError(f"--profile-fields / --usage: the {name} retriever does not index a text view")
        options["view"] = view
    if accepts.store:
        options["store"] = args.store
    if accepts.model and model is not None:
        options["model"] = model
    return options


def add_option_flag(p: argparse.ArgumentParser) -> None:
    """-o KEY=VALUE: a setting of the retriever (`toolscout index`)."""
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the retriever, VALUE parsed as JSON when it can be (repeatable), e.g. "
                        "-o weights=[1,1] -o fusion=rrf for a hybrid")


def retriever_settings(pairs: Sequence[str]) -> dict[str, Any]:
    """-o KEY=VALUE flags as a retriever's settings (what `toolscout index` and `eval` take)."""
    settings = parse_options(pairs, "-o")
    flagged = sorted(set(settings) & {"intents", "reranker"})
    if flagged:  # the pipeline's, not the retriever's: ToolScout.from_tools got them twice
        raise ValueError(f"-o {flagged[0]}=...: not a setting of the retriever; use --no-split for intents, "
                         "--rerank for a reranker")
    return settings


def retriever_systems(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, retriever name, -o settings) of each system `eval` compares, in the order given: the -o flags
    after a --retriever are its settings, and label it (hybrid[fusion=rrf]) unless it has none. The same
    retriever with the same settings twice is refused: it was merged into one system, silently."""
    names = args.retriever or [DEFAULT_RETRIEVER]
    pairs: list[list[str]] = [[] for _ in names]
    for position, pair in args.option:
        if position == 0 and args.retriever:
            raise ValueError(f"-o {pair}: give it after the --retriever it sets (-o goes to the --retriever before it)")
        pairs[max(position, 1) - 1].append(pair)
    systems: list[tuple[str, str, dict[str, Any]]] = []
    for name, given in zip(names, pairs):
        settings = retriever_settings(given)
        label = f"{name}[{','.join(given)}]" if given else name
        same = next((other for other, n, s in systems if (n, s) == (name, settings)), None)  # b=0 is b=0.0
        if same is not None:
            raise ValueError(f"--retriever {label} is given twice (as {same} too): each system once; to compare "
                             "two settings of one retriever, give each its own -o KEY=VALUE")
        systems.append((label, name, settings))
    return systems


def check_trained_model(name: str, model: str | None) -> None:
    """A retriever that is its method only with a model directory (`Accepts.needs_trained_model`) is refused
    without one, by eval and index alike: tool2vec would rank by descriptions alone under its name (neither
    learns usage; code that feeds it usage, `add_usage`, builds it with `ToolScout.from_tools`)."""
    from ..models import model_config
    from ..retrievers.base import retriever_class

    accepts = retriever_class(name).accepts
    trained = model_config(model)
    if accepts.needs_trained_model and (trained is None or trained[1].get("method") != accepts.trained_by):
        given = f"--model {model} is not one" if model else "none was given"
        raise ValueError(f"--retriever {name} needs --model DIR, a `toolscout train {accepts.trained_by}` directory "
                         f"({given}; write one with `toolscout train {accepts.trained_by} --data SET_DIR --out DIR`)")


def pipeline_from_args(args: argparse.Namespace, tools: Sequence[Any] = (), *, store: str | None = None) -> Any:
    """The pipeline `toolscout index`'s flags describe (retriever, --model, view flags, -o options, --rerank,
    --no-split, the fast tier), over `tools` (none: built, not indexed: what `--store` records). `store`:
    where dense vectors are kept instead of --store's."""
    from ..pipeline import ToolScout

    settings = retriever_settings(args.option)
    check_trained_model(args.retriever, args.model)
    options = {**retriever_options(args, args.retriever, args.model), **settings}
    if store is not None and "store" in options:
        options["store"] = store
    reranker = reranker_from_args(args)
    warn_if_endpoint_fails(args, reranker)
    scout = ToolScout.from_tools(tools, retriever=args.retriever, reranker=reranker,
                                 intents=intents_from_args(args), **options)
    if args.fast_queries:
        scout.use_fast_queries(args.fast_queries)
    return scout


# ------------------------------------------------------------------------------------ rerankers

def add_rerank_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank", default=None, metavar="DIR",
                   help="second stage: a `toolscout train cross|refiner` directory, or llm:CONFIG.yaml for the LLM "
                        "reranker (an OpenAI-compatible endpoint, settings as for `expand --llm-config`)")
    p.add_argument("--rerank-depth", type=int, default=None, metavar="N",
                   help="first-stage candidates handed to the reranker (default: the reranker's own, 20 unless trained otherwise)")
    p.add_argument("--rerank-option", action="append", default=[], metavar="KEY=VALUE",
                   help="reranker setting, VALUE parsed as JSON when it can be (repeatable), e.g. "
                        "first_stage_weight=0 for a cross-encoder's own order")


def reranker_from_args(args: argparse.Namespace):
    """The reranker --rerank names (None without it); --rerank-depth overrides its depth."""
    if args.rerank_depth is not None and args.rerank_depth < 1:
        raise ValueError(f"--rerank-depth must be at least 1, got {args.rerank_depth}")
    if not args.rerank:
        if args.rerank_depth is not None or args.rerank_option:
            raise ValueError("--rerank-depth and --rerank-option need --rerank")
        return None
    options = parse_options(args.rerank_option, flag="--rerank-option")
    if args.rerank_depth is not None:
        options["depth"] = args.rerank_depth
    if args.rerank.startswith("llm:"):
        from ..rerank.llm import LLMReranker

        return LLMReranker.from_settings_file(args.rerank[4:], **options)
    from ..rerank.base import load_reranker

    return load_reranker(args.rerank, **options)


def warn_if_endpoint_fails(args: argparse.Namespace, reranker: Any) -> None:
    """An LLM reranker's endpoint is tried once, before the index is built: one that fails is a warning
    naming it (not an error: the endpoint may be down for now), rather than an index whose every search
    pays for it in silence."""
    from ..rerank.llm import LLMReranker

    if not isinstance(reranker, LLMReranker):
        return
    problem = reranker.endpoint_problem()
    if problem is not None:
        warnings.warn(f"--rerank {args.rerank}: the LLM reranker's endpoint {reranker.client.url} failed a test "
                      f"request: {problem}; the index is written, but its searches keep the first stage's order "
                      "while the endpoint fails", stacklevel=2)


def parse_options(pairs: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    """KEY=VALUE flags as a dict; VALUE parsed as JSON when it can be, else kept as text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


# ------------------------------------------------------------------------------------ text views

def add_view_options(parser: argparse.ArgumentParser) -> None:
    """The two text-view flags for `toolscout eval` / `toolscout index`."""
    parser.add_argument("--profile-fields", default=None, metavar="FIELDS",
                        help="profile fields in the indexed text: comma list of "
                             f"{', '.join(PROFILE_FIELDS)}, or default / all / none "
                             "(default: function,tags,when_to_use,limitations)")
    parser.add_argument("--usage", type=int, default=None, metavar="N",
                        help="append up to N known requests per tool (tools.jsonl 'usage'; see toolscout expand --usage)")


def view_from_args(args: argparse.Namespace) -> TextView | None:
    """The TextView the flags ask for, or None when neither flag was given (retriever default)."""
    from ..expand.views import make_view, parse_profile_fields

    fields = getattr(args, "profile_fields", None)
    usage = getattr(args, "usage", None)
    if fields is None and usage is None:
        return None
    return make_view(parse_profile_fields(fields) if fields is not None else None, usage)


# ------------------------------------------------------------------------------------ LLM connection

def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "toolscout" / "llm"


# ------------------------------------------------------------------------------------------ LLM flags

def add_llm_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LLM connection (any OpenAI-compatible chat-completions server)")
    g.add_argument("--llm-config", default=None, metavar="FILE",
                   help="JSON/YAML file with base_url, model, strong_model, judge_model, api_key_env, timeout, "
                        "max_retries, concurrency, cache_dir, json_mode, temperature; flags override it")
    g.add_argument("--base-url", default=None, metavar="URL", help="e.g. http://localhost:8000/v1 or https://api.openai.com/v1")
    g.add_argument("--model", default=None, metavar="NAME", help="the LLM that does the work")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="API key (prefer --api-key-env: a flag shows in the process list)")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help=f"environment variable holding the API key (default {DEFAULT_KEY_ENV})")
    g.add_argument("--timeout", type=float, default=None, help="seconds per request (default 60)")
    g.add_argument("--max-retries", type=int, default=None, help="retries on timeouts, 429 and 5xx (default 4)")
    g.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 4)")
    g.add_argument("--cache-dir", default=None, metavar="DIR",
                   help=f"reply cache: reruns cost nothing (default {default_cache_dir()})")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the reply cache")
    g.add_argument("--json-mode", choices=("auto", "always", "never"), default=None,
                   help="send response_format=json_object: auto falls back when the server rejects it (default auto)")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature")


def wants_llm(args: argparse.Namespace) -> bool:
    return bool(args.llm_config or args.base_url or args.model)


def llm_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> "Any":
    """LLMSettings from the config file (if any), then the flags, then the key from the environment;
    checked once, up front (`LLMSettings.from_sources`), each error naming its flag or key and file."""
    from ..llm import LLMSettings

    flags = {name: (f"--{name.replace('_', '-')}", getattr(args, name, None))
             for name in ("base_url", "model", "timeout", "max_retries", "concurrency", "cache_dir", "json_mode",
                          "temperature", "strong_model", "judge_model")}
    settings = LLMSettings.from_sources(args.llm_config, flags)
    settings.fill_api_key(os.environ if environ is None else environ, key=args.api_key,
                          key_env_flag=args.api_key_env, default_env=DEFAULT_KEY_ENV, config_file=args.llm_config)
    if args.no_cache:
        settings.cache_dir = None
    elif not settings.cache_dir:
        settings.cache_dir = str(default_cache_dir())
    return settings

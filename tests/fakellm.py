"""A small OpenAI-compatible chat server for tests and the offline demo. Test code, never a product default.

A real HTTP server (http.server, one thread per request) on 127.0.0.1:

    with FakeLLM() as llm:                       # a free port; llm.url == "http://127.0.0.1:PORT/v1"
        llm.script(Reply("not json"), Reply(status=500), when=mentions("get_weather"))
        llm.script(Reply(status=429, headers={"Retry-After": "0.01"}))
        ...                                       # unscripted requests go to `responder` (heuristic by default)
        llm.requests                              # every request body received, in arrival order

Scripted replies are consumed in order by the requests their `when` predicate matches (default: any),
before the responder is asked. A reply can carry an HTTP status and headers, raw body text, a `delay`
(sleep before answering, to run past a client's timeout), explicit log-probabilities, a `finish_reason` and
`null_content` (`"content": null`). `reject_json_mode`
makes the server answer 400 to any request that sets `response_format`, like servers without JSON mode;
`reject_max_tokens` answers 400 to any request that sets `max_tokens`, like OpenAI's reasoning models (o1, o3,
gpt-5), which take only `max_completion_tokens`.
Every 200 reply carries `usage` (prompt tokens = words in the messages, completion tokens = words in the
reply) and, when the request asks for `logprobs`, log-probabilities in the OpenAI chat shape.

`heuristic_reply` answers the prompts of toolscout's expansion, judge, generation and polish steps with
plausible JSON built from the request text, so whole pipelines run offline:

    python tests/fakellm.py --port 8765          # serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Predicate = Callable[[dict], bool]


@dataclass
class Reply:
    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str | bytes | None = None  # raw body, sent as is (overrides content); bytes for any encoding
    delay: float = 0.0               # seconds to sleep before answering
    logprobs: list[dict] | None = None  # explicit chat-shape logprobs content
    null_content: bool = False       # `"content": null`, as refusals and reasoning models out of tokens send
    finish_reason: str = "stop"


def mentions(*words: str) -> Predicate:
    """Requests whose messages contain every one of `words`."""
    return lambda req: all(w in message_text(req) for w in words)


def model_is(name: str) -> Predicate:
    return lambda req: req.get("model") == name


def all_of(*predicates: Predicate) -> Predicate:
    return lambda req: all(p(req) for p in predicates)


def message_text(request: dict) -> str:
    return "\n".join(str(m.get("content", "")) for m in request.get("messages", []))


class FakeLLM:
    def __init__(self, responder: Callable[[dict], Reply | str] | None = None, port: int = 0,
                 reject_json_mode: bool = False, reject_max_tokens: bool = False):
        self.responder = responder or heuristic_reply
        self.reject_json_mode = reject_json_mode
        self.reject_max_tokens = reject_max_tokens
        self.requests: list[dict] = []
        self._scripts: list[tuple[Predicate, list[Reply]]] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "FakeLLM":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def script(self, *replies: Reply, when: Predicate | None = None) -> None:
        with self._lock:
            self._scripts.append((when or (lambda req: True), list(replies)))

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._scripts.clear()

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def _next_reply(self, request: dict) -> Reply:
        with self._lock:
            self.requests.append(request)
            for predicate, replies in self._scripts:
                if replies and predicate(request):
                    return replies.pop(0)
        if self.reject_json_mode and "response_format" in request:
            return Reply(status=400, body=json.dumps({"error": {"message": "response_format is not supported",
                                                                "type": "invalid_request_error"}}))
        if self.reject_max_tokens and "max_tokens" in request:  # OpenAI's wording, param and code
            return Reply(status=400, body=json.dumps({"error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                           "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}))
        answer = self.responder(request)
        return answer if isinstance(answer, Reply) else Reply(str(answer))


def _words(text: str) -> int:
    return len(text.split())


def completion_body(request: dict, reply: Reply) -> dict:
    content = reply.content or ""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                      "content": None if reply.null_content else content},
                              "finish_reason": reply.finish_reason}
    if request.get("logprobs"):
        choice["logprobs"] = {"content": reply.logprobs if reply.logprobs is not None
                              else _logprobs(content, int(request.get("top_logprobs") or 0))}
    prompt = sum(_words(str(m.get("content", ""))) for m in request.get("messages", []))
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", "fake"), "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": _words(content),
                      "total_tokens": prompt + _words(content)}}


def _logprobs(content: str, top: int) -> list[dict]:
    out = []
    for i, token in enumerate(re.findall(r"\S+|\s+", content) or [""]):
        alternatives = [{"token": token, "logprob": -0.1, "bytes": None}]
        alternatives += [{"token": f"<alt{j}>", "logprob": -3.0 - j, "bytes": None} for j in range(1, top)]
        out.append({"token": token, "logprob": -0.1, "bytes": None, "top_logprobs": alternatives[:top]})
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timeout tests) closes its connection while the request is being read or the
        # reply written; that is expected, and the default handler would print a traceback into the output
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler(fake: FakeLLM):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                return self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}), {})
            try:
                request = json.loads(raw)
            except json.JSONDecodeError:
                return self._send(400, '{"error": {"message": "body is not JSON"}}', {})
            request["_headers"] = {k.lower(): v for k, v in self.headers.items()}
            reply = fake._next_reply(request)
            if reply.delay:
                time.sleep(reply.delay)
            if reply.body is not None:
                body = reply.body
            elif reply.status == 200:
                body = json.dumps(completion_body(request, reply))
            else:
                body = json.dumps({"error": {"message": reply.content or f"scripted error {reply.status}"}})
            self._send(reply.status, body, reply.headers)

        def _send(self, status: int, body: str | bytes, headers: dict[str, str]) -> None:
            # a client that gave up (timeout tests) makes these writes fail: _Server.handle_error drops it
            data = body if isinstance(body, bytes) else body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


# ------------------------------------------------------------------------------ heuristic replies

_STOP = {"the", "a", "an", "of", "to", "and", "or", "for", "in", "on", "with", "by", "this", "that", "is", "are",
         "api", "given", "from", "it", "its", "be", "as", "at", "user", "users", "which", "will", "can", "id"}


def _split_words(text: str) -> list[str]:
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return [w for w in re.split(r"[^A-Za-z0-9]+", text.lower()) if w]


def heuristic_reply(request: dict) -> Reply:
    """A plausible answer to each toolscout prompt, from the text of the request alone."""
    text = message_text(request)
    if "<profile>" in text:
        return Reply(json.dumps({"faithful": True, "reason": "every field restates the documentation"}))
    if "tool_profile" in text and "<document>" in text:
        return Reply(json.dumps({"tool_profile": _profile(text)}))
    if "<request>" in text:
        query = re.search(r"<request>\s*(.*?)\s*</request>", text, re.DOTALL).group(1)
        polished = re.sub(r",? (and )?then ", " and ", query)
        return Reply(json.dumps({"query": polished, "changed": polished != query}))
    if "The assistant can call these" in text:
        return Reply(json.dumps(_pick(text)))
    return Reply("I can only answer toolscout prompts.")


def _document(text: str) -> dict:
    raw = re.search(r"<document>\s*(.*?)\s*</document>", text, re.DOTALL).group(1)
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        doc = {"description": raw}
    return doc if isinstance(doc, dict) else {"description": str(doc)}


def _params(doc: dict) -> dict:
    for key in ("parameters", "input_parameters", "inputSchema", "input_schema"):
        value = doc.get(key)
        if isinstance(value, dict):
            return value.get("properties", value) if isinstance(value.get("properties"), dict) else value
    return {}


def _profile(text: str) -> dict:
    doc = _document(text)
    name = str(doc.get("name", "tool"))
    description = " ".join(str(doc.get("description") or "").split())
    first = re.split(r"(?<=[.!?])\s", description)[0] if description else f"Runs {' '.join(_split_words(name))}"
    first = re.sub(r"^(This|The) (API|tool|function) ", "", first).rstrip(".")
    function = " ".join(first.split()[:15])
    tags: list[str] = []
    for word in _split_words(name) + [w for p in _params(doc) for w in _split_words(p)] + _split_words(description):
        if word not in _STOP and len(word) > 2 and word not in tags:
            tags.append(word)
    tags = (tags + ["tool", "api", "service"])[:5]
    profile: dict[str, Any] = {"function": function[:1].upper() + function[1:], "tags": tags[:max(3, min(5, len(tags)))]}
    if description:
        profile["when_to_use"] = "When a user wants to " + " ".join(first.split()[:12]).lower()
    formats = [f"{p}: {spec.get('description')}" for p, spec in _params(doc).items()
               if isinstance(spec, dict) and "format" in str(spec.get("description", "")).lower()]
    if formats:
        profile["limitations"] = "; ".join(formats)[:200]
    return profile


def _pick(text: str) -> dict:
    tools = re.findall(r"^- (\S+?): (.*?)(?: \[parameters: .*\])?$", text, re.MULTILINE)
    tools = [(n, d) for n, d in tools if n not in ("find_restaurants", "book_table")]
    if len(tools) < 2:
        return {"tools": [], "query": ""}
    # the first listed tool, plus the one sharing most description words with it
    words = [set(_split_words(d)) - _STOP for _n, d in tools]
    best = max(range(1, len(tools)), key=lambda i: (len(words[0] & words[i]), -i))
    chosen = [tools[0], tools[best]]
    clauses = [re.sub(r"^(This|The) (API|tool|function) ", "", d).rstrip(".").lower() or " ".join(_split_words(n))
               for n, d in chosen]
    query = f"Could you {clauses[0]}, then {clauses[1]}?"
    return {"tools": [n for n, _d in chosen], "query": query}


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve heuristic OpenAI-compatible chat replies (test/demo only).")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = FakeLLM(port=args.port).start()
    print(f"fake LLM serving at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()

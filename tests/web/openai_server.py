"""A local HTTP server that speaks the OpenAI chat-completions API, for driving the real openai
client in tests (never a mock).

`POST /v1/chat/completions` answers with the next scripted `Step`: a reply (streamed as SSE
chunks when the request asks for `stream`, with a usage chunk when it asks for
`stream_options.include_usage`; plain JSON otherwise), or an HTTP error with an OpenAI-shaped
body (429 with Retry-After, 500, 401, 404...), optionally after a delay or a pause between
chunks. When the script runs out, the last step repeats. `outage(seconds, *errors)` makes
every request for that long get the errors in turn (scripted steps wait until it is over), for
an endpoint that is down for a while and then recovers. Every request body is recorded, with
its headers (`_headers`, lower-case names; `_authorization`, "" when none was sent).
`GET /v1/models` lists the models the server knows.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    reply: str = ""
    status: int = 200
    message: str = ""  # the error's message
    retry_after: float | None = None
    delay_s: float = 0.0  # before the response starts
    chunk_delay_s: float = 0.0  # between streamed chunks
    chunk_chars: int = 24
    usage: bool = True  # report token usage
    prompt_tokens: int | None = None  # default: a rough count of the request
    completion_tokens: int | None = None
    models: tuple[str, ...] = ()  # only these models exist (404 for others); () = any


@dataclass
class Script:
    steps: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    down_until: float = 0.0  # time.monotonic()
    down_errors: list[Step] = field(default_factory=list)
    down_hits: int = 0

    def next(self) -> Step:
        with self.lock:
            if time.monotonic() < self.down_until:
                self.down_hits += 1
                return self.down_errors[(self.down_hits - 1) % len(self.down_errors)]
            if not self.steps:
                return Step(reply="no scripted reply")
            return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]

    def add(self, *steps: Step) -> None:
        with self.lock:
            self.steps.extend(steps)

    def outage(self, seconds: float, *errors: Step) -> None:
        """From now on, for `seconds`, answer every request with `errors` in turn (default: 503);
        `outage(0)` ends one now."""
        with self.lock:
            self.down_until = time.monotonic() + seconds
            self.down_errors = list(errors) or [Step(status=503, message="down for maintenance")]
            self.down_hits = 0


def _error(status: int, message: str) -> dict[str, Any]:
    kinds = {
        401: "invalid_request_error",
        404: "invalid_request_error",
        429: "rate_limit_exceeded",
        500: "server_error",
    }
    codes = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}
    return {
        "error": {
            "message": message or f"scripted error {status}",
            "type": kinds.get(status, "server_error"),
            "param": None,
            "code": codes.get(status),
        }
    }


class Handler(BaseHTTPRequestHandler):
    script: Script  # set on the subclass per server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": []})
        else:
            self._json(404, _error(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, _error(400, "body is not JSON"))
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, _error(404, f"no route {self.path}"))
            return
        body["_authorization"] = self.headers.get("Authorization", "")
        body["_headers"] = {name.lower(): value for name, value in self.headers.items()}
        self.script.requests.append(body)
        step = self.script.next()
        if step.delay_s:
            time.sleep(step.delay_s)
        model = body.get("model", "")
        if step.status == 200 and step.models and model not in step.models:
            self._json(404, _error(404, f"The model `{model}` does not exist."))
            return
        if step.status != 200:
            headers = {}
            if step.retry_after is not None:
                headers["Retry-After"] = f"{step.retry_after:g}"
            self._json(step.status, _error(step.status, step.message), headers)
            return
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        usage = {
            "prompt_tokens": step.prompt_tokens
            if step.prompt_tokens is not None
            else prompt_chars // 4,
            "completion_tokens": step.completion_tokens
            if step.completion_tokens is not None
            else len(step.reply) // 4,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if body.get("stream"):
            self._stream(step, model, usage, body)
        else:
            self._json(
                200,
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": step.reply},
                            "finish_reason": "stop",
                        }
                    ],
                    **({"usage": usage} if step.usage else {}),
                },
            )

    def _stream(self, step: Step, model: str, usage: dict, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict:
            return {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }

        def send(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        try:
            send(chunk({"role": "assistant", "content": ""}))
            text = step.reply
            for i in range(0, len(text), step.chunk_chars):
                if step.chunk_delay_s:
                    time.sleep(step.chunk_delay_s)
                send(chunk({"content": text[i : i + step.chunk_chars]}))
            send(chunk({}, "stop"))
            include = (body.get("stream_options") or {}).get("include_usage")
            if step.usage and include:
                send(
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass


class OpenAIServer:
    """`with OpenAIServer() as server:` then `server.base_url`, `server.script.add(Step(...))`."""

    def __init__(self) -> None:
        self.script = Script()
        handler = type("ScriptedHandler", (Handler,), {"script": self.script})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.script.requests

    def __enter__(self) -> OpenAIServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

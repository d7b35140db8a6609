"""Real HTTP servers on loopback for the witness and monitor tests: one answering from a Python
function (a log that answers endless bodies), and a proxy in front of a served log that can
hold a request and never pass it on (to kill a witness in the middle of a step)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

Answer = tuple[int, Iterable[bytes]]
Route = Callable[[str, str, bytes, dict[str, str]], Answer]


@dataclass
class Served:
    """A loopback server: its URL, and how many body bytes it sent per path (set once the
    answer ended, the client having read it whole or hung up)."""

    url: str
    sent: dict[str, int] = field(default_factory=dict)
    ended: threading.Condition = field(default_factory=threading.Condition)

    def wait_sent(self, path: str, timeout: float = 60.0) -> int:
        with self.ended:
            assert self.ended.wait_for(lambda: path in self.sent, timeout), f"no answer {path}"
            return self.sent[path]


@contextmanager
def serve(route: Route) -> Iterator[Served]:
    """Serve ``route(method, path, body, headers) -> (status, chunks)``, each answer chunked."""
    served = Served("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            status, chunks = route(self.command, self.path, body, dict(self.headers))
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            try:
                for chunk in chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                with served.ended:
                    served.sent[self.path.partition("?")[0]] = sent
                    served.ended.notify_all()

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


def endless(chunk: bytes = b"x" * 65536, total: int = 256 << 20) -> Iterator[bytes]:
    """``total`` bytes (256 MiB by default), made as they are sent."""
    for _ in range(total // len(chunk)):
        yield chunk


_FORWARDED = {"authorization", "content-type"}


@dataclass
class Proxy:
    """A pass-through to ``upstream`` that holds requests whose path matches ``hold`` until
    ``release`` is set, then drops them (503, not passed on); ``held`` is set when one
    arrives."""

    upstream: str
    hold: str | None = None
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        if self.hold is not None and re.search(self.hold, path):
            self.held.set()
            self.release.wait(120)
            return 503, []  # never passed on: its sender is gone
        response = httpx.request(
            method,
            self.upstream + path,
            content=body or None,
            headers={k: v for k, v in headers.items() if k.lower() in _FORWARDED},
            timeout=30,
        )
        return response.status_code, [response.content] if response.content else []

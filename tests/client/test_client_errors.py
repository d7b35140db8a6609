"""The server's errors raised by the client as their own classes (401, 403 for a role and for
an approval, 404, 409, 422, 429), what it raises when there is no server or no affidavit at
the URL, and what importing it costs."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

import affidavit
from affidavit import AffidavitError, Client, ConfigError
from affidavit.client import ApiError, ServerUnreachable
from affidavit.client._calls import Waiter
from affidavit.client.errors import BY_CODE
from affidavit.core import errors
from affidavit.core.approvals import ApprovalRefused
from affidavit.faces.auth import Forbidden, Unauthorized
from affidavit.faces.errors import FACES, class_key
from affidavit.faces.ratelimit import RateLimited
from tests.api.conftest import WAITING_PLAN, Api
from tests.client.helpers import client, key


def test_an_unknown_or_revoked_key_is_unauthorized(api: Api) -> None:
    for who in ("bad", "revoked"):
        with Client(api.url, api_key=key(api, who)) as c, pytest.raises(Unauthorized) as caught:
            c.list()
        assert caught.value.code == "unauthorized"
        assert caught.value.message == "invalid or revoked API key"
        assert "apikeys create" in caught.value.hint


def test_a_role_that_may_not_is_forbidden(api: Api) -> None:
    job_id = api.waiting_job()
    with client(api, "observer_a") as c:
        with pytest.raises(Forbidden, match="role 'observer' may not do this") as caught:
            c.submit(WAITING_PLAN, {"x": 1})
        assert caught.value.code == "forbidden" and "observer < agent < admin" in caught.value.hint
        with pytest.raises(Forbidden):
            c.cancel(job_id)
    assert api.store.get_job(job_id).status == "waiting"


def test_the_submitter_approving_is_refused(api: Api) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(WAITING_PLAN, {"x": 1})
        assert api.runtime.run_job(job.job_id).status == "waiting"
        version = api.store.get_job(job.job_id).version
        with pytest.raises(ApprovalRefused, match="submitted the job"):
            c.approve(job.job_id, f"{job.job_id}:ok")
    assert api.store.get_job(job.job_id).version == version  # nothing written


def test_an_unknown_job_and_another_namespaces_are_not_found(api: Api) -> None:
    other = api.waiting_job(namespace="b")
    with client(api, "observer_a") as c:
        for job_id in ("no-such-job", other):
            with pytest.raises(affidavit.JobNotFound) as caught:
                c.get(job_id)
            assert caught.value.message == f"job {job_id!r} not found"
            assert isinstance(caught.value, errors.NotFound)
            assert "jobs list" in caught.value.hint


def test_conflicts_are_409s_of_their_class(api: Api) -> None:
    with client(api, "agent_a") as c:
        c.submit(WAITING_PLAN, {"x": 1}, idempotency_key="conflict")
        with pytest.raises(errors.IdempotencyConflict) as caught:
            c.submit(WAITING_PLAN, {"x": 2}, idempotency_key="conflict")
        assert caught.value.code == "idempotency_conflict"


def test_an_invalid_plan_or_payload_is_its_own_error(api: Api) -> None:
    cycle = {
        "nodes": [
            {"id": "a", "type": "pure", "tool": "think", "depends_on": ["b"]},
            {"id": "b", "type": "pure", "tool": "think", "depends_on": ["a"]},
        ]
    }
    job_id = api.waiting_job()
    with client(api, "agent_a") as c, pytest.raises(errors.CycleError) as caught:
        c.submit(cycle, {})
    assert caught.value.code == "plan_cycle"
    with client(api, "approver_a") as c, pytest.raises(errors.SignalPayloadError):
        c.signal(job_id, f"{job_id}:ok", {"approved": "yes"})


def test_an_error_without_a_class_here_keeps_its_code_and_status(api: Api) -> None:
    job_id = api.waiting_job()
    with client(api, "admin") as c, pytest.raises(ApiError) as caught:
        c.resume(job_id, "retry")
    assert (caught.value.code, caught.value.status) == ("invalid_state", 409)
    assert caught.value.hint  # the server's


def test_rate_limited_carries_retry_after(limited: Api) -> None:
    with client(limited, "agent_a") as c:
        for _ in range(3):
            c.list()
        with pytest.raises(RateLimited) as caught:
            c.list()
    assert caught.value.retry_after > 0 and caught.value.code == "rate_limited"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_no_server_is_server_unreachable() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with Client(url, api_key="afv_x", timeout=5) as c:
        with pytest.raises(ServerUnreachable, match="failed") as caught:
            c.get("some-job")
        assert "affidavit serve" in caught.value.hint
        # wait rides out an absent server, but not past its timeout
        with pytest.raises(ServerUnreachable):
            c.wait("some-job", timeout=0.3, poll_seconds=0.05)


@pytest.fixture
def not_affidavit() -> Iterator[str]:
    """An HTTP server on loopback that answers everything with a proxy's 502 page."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>502 Bad Gateway</html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


def test_an_answer_that_is_not_the_apis_is_an_api_error(not_affidavit: str) -> None:
    with Client(not_affidavit, api_key="afv_x") as c, pytest.raises(ApiError) as caught:
        c.get("some-job")
    assert (caught.value.code, caught.value.status) == ("http_error", 502)
    assert "502 Bad Gateway" in caught.value.message and "/health" in caught.value.hint


def test_the_key_comes_from_the_environment_or_is_a_config_error(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AFFIDAVIT_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="no API key"):
        Client(api.url)
    monkeypatch.setenv("AFFIDAVIT_API_KEY", key(api, "agent_a"))
    with Client(api.url) as c:
        assert c.submit(WAITING_PLAN, {"x": 3}).submitted_by == "bot-a"


def test_wait_rides_out_only_what_may_pass() -> None:
    waiter = Waiter(timeout=None, poll_seconds=1.0, retry_seconds=60.0)
    waiter.failed(ServerUnreachable("down"))
    waiter.failed(errors.StoreUnavailable("restarting"))
    limited = RateLimited(7.0)
    waiter.failed(limited)
    assert waiter.pause() == 7.0  # the Retry-After
    for lasting in (affidavit.JobNotFound("j"), Forbidden("no"), ApiError("x", status=409)):
        with pytest.raises(type(lasting)):
            waiter.failed(lasting)
    impatient = Waiter(timeout=None, poll_seconds=1.0, retry_seconds=0.0)
    with pytest.raises(ServerUnreachable):
        impatient.failed(ServerUnreachable("down"))


def test_every_code_has_one_class_with_a_faces_row() -> None:
    for code, cls in BY_CODE.items():
        assert cls.code == code and issubclass(cls, AffidavitError)
        assert class_key(cls) in FACES, cls
    # each class of affidavit.core.errors is raised as itself, or as the base whose code it
    # keeps (NoSchemaError is a MigrationError; UnreadableEventError a ReplayError)
    classes = [v for v in vars(errors).values() if isinstance(v, type)]
    for cls in classes:
        if issubclass(cls, AffidavitError) and cls.code not in ("error", "forbidden"):
            assert issubclass(cls, BY_CODE[cls.code]), cls
    assert BY_CODE["forbidden"] is Forbidden  # (a key's role: the claims' has its own route)
    for own in (ApiError, ServerUnreachable):
        assert class_key(own) in FACES


def test_importing_the_client_imports_neither_the_runtime_nor_the_store() -> None:
    code = (
        "import sys, affidavit\n"
        "affidavit.Client, affidavit.AsyncClient\n"
        "print(' '.join(sorted({m.split('.')[1] for m in sys.modules "
        "if m.startswith('affidavit.')})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(out.split())
    assert loaded <= {"api", "client", "core", "faces"}, loaded
    for engine in ("runtime", "store", "record", "verify", "tlog", "packs"):
        assert engine not in loaded


def test_wait_stops_where_the_runtimes_wait_does() -> None:
    from affidavit.client import _calls
    from affidavit.runtime import _waiting

    assert _calls.SETTLED_STATUSES == _waiting.SETTLED_STATUSES

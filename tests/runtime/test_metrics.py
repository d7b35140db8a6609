"""A worker's own counters (steps by outcome, ledger decisions), in process and served over
HTTP by `affidavit worker --metrics-port`, on both backends."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from affidavit import RetryableError, Runtime, Tool, ToolContext, ToolRegistry
from tests.runtime.helpers import node, plan


def test_steps_and_ledger_decisions_are_counted(store_url: str) -> None:
    tries: list[int] = []

    def flaky(ctx: ToolContext) -> dict[str, Any]:
        tries.append(ctx.attempt)
        if len(tries) == 1:
            raise RetryableError("try again")
        return {"ok": True}

    def think(ctx: ToolContext, x: Any) -> Any:
        return x

    tools = ToolRegistry([Tool("flaky", flaky, "tool"), Tool("think", think, "pure")])
    graph = plan(node("a", "flaky"), node("b", "think", "pure", args={"x": "${a}"}, deps=["a"]),
                 retry={"max_attempts": 3, "backoff_seconds": 0})  # fmt: skip
    with Runtime(store_url, tools=tools) as rt:
        job_id = rt.submit(graph, {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        m = rt.metrics
        assert (
            m.value("affidavit_steps_total", node_type="tool", result_type="retryable_failure") == 1
        )
        assert m.value("affidavit_steps_total", node_type="tool",
                       result_type="side_effect_committed") == 1  # fmt: skip
        assert m.value("affidavit_steps_total", node_type="pure", result_type="pure") == 1
        # the first try inserted the row, the retry restarted the failed one: both allowed
        assert m.value("affidavit_ledger_decisions_total", decision="allow_execute") == 2
        text = m.render().decode()
        assert 'affidavit_steps_total{node_type="pure",result_type="pure"} 1.0' in text


TOOLS_MODULE = """
from affidavit import pure, tool

@tool("act")
def act(ctx):
    return {"did": ctx.node_id}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_serves_its_counters(store_url: str, tmp_path: Path) -> None:
    tools = tmp_path / "metrics_tools.py"
    tools.write_text(TOOLS_MODULE)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", "--tools", str(tools), "--db", store_url,
         "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with Runtime(store_url, tools=ToolRegistry([Tool("act", lambda ctx: {}, "tool")])) as rt:
            job_id = rt.submit(plan(node("a", "act")), {}).job_id
            deadline = time.monotonic() + 60
            # the step counter moves when the step's event lands, before job_completed does:
            # wait for the job, then the served counters must already show the step
            while rt.get_job(job_id).status != "completed":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, rt.get_job(job_id).status
                time.sleep(0.1)
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            sample = 'affidavit_steps_total{node_type="tool",result_type="side_effect_committed"}'
            assert f"{sample} 1.0" in text
            assert 'affidavit_ledger_decisions_total{decision="allow_execute"} 1.0' in text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)

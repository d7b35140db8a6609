"""The trace page follows a running job's stream in the real headless Chromium: a value the job
emits after the page was drawn appears on it without a reload, and the page settles on the
job's end."""

from __future__ import annotations

import threading
from typing import Any

from affidavit import Runtime
from tests.api import stream_tools
from tests.api.conftest import Api
from tests.api.test_ui import ARTIFACTS, browser, open_page  # noqa: F401 (browser: a fixture)


def test_a_value_appears_live(browser: Any, api: Api) -> None:  # noqa: F811
    with Runtime(api.store.url, tools=stream_tools.TOOLS) as rt:
        job_id = rt.submit("gated_agent", {}, namespace="a").job_id
        gate = stream_tools.GATES[job_id] = threading.Event()
        runner = threading.Thread(target=rt.run_job, args=(job_id,), daemon=True)
        runner.start()
        try:
            page = open_page(browser, api, "/ui/", "observer_a")  # (the key, once)
            # the job holds inside its step once its second value is recorded
            for _ in range(3000):
                if (
                    len([e for e in api.store.list_events(job_id) if e.type == "stream_emitted"])
                    == 2
                ):
                    break
                threading.Event().wait(0.02)
            asked: list[str] = []
            page.on("request", lambda request: asked.append(request.url))
            page.goto(f"{api.url}/ui/jobs/{job_id}")
            page.wait_for_selector("body[data-ready=true]")
            page.evaluate("window.sameDocument = true")
            items = page.locator("#stream li")
            assert items.count() == 2
            assert "second" not in page.inner_text("#stream")
            gate.set()
            page.wait_for_selector("#stream li:has-text('second')")
            assert page.evaluate("window.sameDocument") is True  # no reload
            # read from the job's stream, not by polling the job
            assert f"{api.url}/api/jobs/{job_id}/stream?after_version=" in " ".join(asked)
            assert f"{api.url}/api/jobs/{job_id}" not in asked
            page.wait_for_selector("#job-status:has-text('completed')")
            assert [items.nth(i).get_attribute("data-seq") for i in range(3)] == ["0", "1", "2"]
            assert "#0, attempt 1" in items.nth(1).inner_text()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"trace-stream-{api.store.backend}.png"))
            page.close()
        finally:
            gate.set()
            runner.join(30)

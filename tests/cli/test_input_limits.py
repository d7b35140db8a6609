"""Every file a user names on the command line is read with a bound (64 MiB by default,
`--max-input-bytes` or $AFFIDAVIT_MAX_INPUT_BYTES to change it): `/dev/zero` as a plan, job
input or claim is refused at the bound — not read until the kernel kills the process — and
nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.core.config import DEFAULT_MAX_INPUT_BYTES
from affidavit.examples import refund
from affidavit.store import open_store
from tests.cli.test_cli import cli, cli_env, json_of

TOOLS = "affidavit.examples.refund"
ZERO = "/dev/zero"


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(refund.PLAN))
    return path


def no_jobs(url: str) -> bool:
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not path.exists():
            return True
    store = open_store(url)
    try:
        return store.list_jobs() == []
    finally:
        store.close()


def test_a_plan_input_or_claim_from_dev_zero_is_refused_at_the_bound(
    store_url: str, plan_file: Path
) -> None:
    db = ("--db", store_url)
    bound = f"larger than {DEFAULT_MAX_INPUT_BYTES:,} bytes"
    cases = [
        (("submit", ZERO, "--tools", TOOLS, *db), 3, f"plan file '{ZERO}' is {bound}"),
        (("run", ZERO, "--tools", TOOLS, *db), 3, f"plan file '{ZERO}' is {bound}"),
        (
            ("submit", str(plan_file), "--tools", TOOLS, "--input", f"@{ZERO}", *db),
            3,
            f"--input file '{ZERO}' is {bound}",
        ),
        (
            ("claims", "verify", "--agent", "a", "--type", "test_result", "--claim", f"@{ZERO}",
             "--command", "true", "--verifier", "b", *db),
            5,
            f"--claim file '{ZERO}' is {bound}",
        ),
    ]  # fmt: skip
    for args, code, message in cases:
        human = cli(*args)
        assert human.returncode == code, (args, human.stderr)
        assert message in human.stderr and "Traceback" not in human.stderr
        assert "--max-input-bytes" in human.stderr  # the hint says how to raise it
        as_json = cli(*args, "--json")
        assert as_json.returncode == code
        assert message in json_of(as_json)["error"]["message"]
    assert no_jobs(store_url)


def test_the_bound_is_set_by_option_or_environment(
    store_url: str, plan_file: Path, tmp_path: Path
) -> None:
    shop = refund.setup_shop(tmp_path / "shop")
    order = tmp_path / "order.json"
    order.write_text(json.dumps({"order_id": "A-1001", "data_dir": str(shop)}))
    size = plan_file.stat().st_size
    args = ("submit", str(plan_file), "--tools", TOOLS, "--input", f"@{order}")
    db = ("--db", store_url, "--json")

    small = cli("--max-input-bytes", str(size - 1), *args, *db)
    assert small.returncode == 3
    assert json_of(small)["error"]["code"] == "invalid_plan"
    assert f"is larger than {size - 1:,} bytes" in json_of(small)["error"]["message"]
    by_env = cli(*args, *db, env={**cli_env(), "AFFIDAVIT_MAX_INPUT_BYTES": str(size - 1)})
    assert by_env.returncode == 3 and "larger than" in by_env.stdout
    bad_env = cli(*args, *db, env={**cli_env(), "AFFIDAVIT_MAX_INPUT_BYTES": "lots"})
    assert bad_env.returncode == 3
    assert "AFFIDAVIT_MAX_INPUT_BYTES='lots'" in json_of(bad_env)["error"]["message"]
    assert no_jobs(store_url)

    exact = cli("--max-input-bytes", str(size), *args, *db)  # the bound itself is allowed
    assert exact.returncode == 0, exact.stderr
    assert json_of(exact)["status"] == "pending"

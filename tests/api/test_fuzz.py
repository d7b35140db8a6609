"""The API fuzzed from its own OpenAPI schema (schemathesis, bounded: 10 examples per operation
and key, 100 with ``--soak``): whatever a request holds, no server error and no response that
the schema does not describe."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import Api
from tests.conftest import examples

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = examples(10, 100)  # per operation and key


def test_api_fuzz(api: Api) -> None:
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        # Claim verification runs allow-listed programs; fuzzing it with a key that may verify
        # would run whatever arguments the fuzzer makes up (sleep 1e9, pip uninstall -y ...),
        # so it is fuzzed with keys that are refused before anything runs.
        runs_commands = operation.path in ("/api/claims/verify", "/api/claims/{claim_id}/verify")
        callers = (
            ("observer_a", "agent_a", "none") if operation.path == "/api/claims/verify"
            else ("observer_a", "none") if runs_commands
            else ("admin", "agent_a", "none")
        )  # fmt: skip
        for who in callers:
            fuzz(api, operation, {} if who == "none" else {"Authorization": api.keys[who]})


def fuzz(api: Api, operation: Any, headers: dict[str, str]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        case.call_and_validate(base_url=api.url, headers=headers, checks=CHECKS)

    run()

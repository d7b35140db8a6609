"""``affidavit agents``, ``claims`` and ``trust`` as a user runs them (both backends)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import cli, json_of


def setup_agents(url: str) -> None:
    for agent, ns, role in (
        ("alice", "team", "agent"),
        ("vera", "team", "agent"),
        ("otto", "team", "observer"),
    ):
        result = cli(
            "agents", "add", agent, "--namespace", ns, "--role", role, "--db", url, "--json"
        )
        assert result.returncode == 0, result.stderr
        assert json_of(result)["trust_score"] == 0.5


def verify(
    url: str,
    *extra: str,
    claim: str = '{"return_code": 0}',
    cmd: str = "true",
    verifier: str = "vera",
):  # type: ignore[no-untyped-def]
    return cli(
        "claims",
        "verify",
        "--agent",
        "alice",
        "--type",
        "custom",
        "--claim",
        claim,
        "--command",
        cmd,
        "--verifier",
        verifier,
        "--db",
        url,
        *extra,
    )


def test_verify_history_stats_and_trust(store_url: str) -> None:
    setup_agents(store_url)
    ok = verify(store_url, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json_of(ok)
    assert set(doc) >= {
        "accurate",
        "decided_by",
        "actual",
        "verification_id",
        "evidence_id",
        "new_trust_score",
        "propagation",
    }
    assert doc["accurate"] is True and doc["decided_by"] == "return_code"
    assert doc["new_trust_score"] == 0.55

    wrong = verify(store_url, "--json", cmd="false")
    assert wrong.returncode == 1 and json_of(wrong)["accurate"] is False

    timed = verify(store_url, "--json", "--timeout", "0.2", claim="{}", cmd="sleep 5")
    assert timed.returncode == 1 and json_of(timed)["decided_by"] == "timeout"

    human = verify(store_url, claim='{"output_contains": "hi"}', cmd="echo hi")
    assert human.returncode == 0 and "accurate" in human.stdout

    history = cli("claims", "history", "alice", "--db", store_url, "--json")
    assert [h["verdict"] for h in json_of(history)] == [
        "accurate",
        "error",
        "inaccurate",
        "accurate",
    ]
    table = cli("claims", "history", "alice", "--db", store_url)
    assert table.returncode == 0 and "return_code" in table.stdout

    stats = json_of(cli("claims", "stats", "alice", "--db", store_url, "--json"))
    assert (stats["total_verifications"], stats["error_verifications"]) == (3, 1)
    assert cli("claims", "stats", "alice", "--db", store_url).returncode == 0

    trust = cli("trust", "show", "alice", "--db", store_url, "--json")
    assert trust.returncode == 0
    assert json_of(trust)["trust_log"]["ok"] is True
    log = cli("trust", "history", "alice", "--db", store_url, "--json")
    assert log.returncode == 0
    assert len(json_of(log)["entries"]) == 5
    assert cli("trust", "history", "alice", "--db", store_url).returncode == 0

    taken = cli("agents", "add", "alice", "--db", store_url, "--json")
    assert taken.returncode == 3 and json_of(taken)["error"]["code"] == "agent_exists"
    bad_role = cli("agents", "add", "bob", "--role", "root", "--db", store_url, "--json")
    assert bad_role.returncode == 5 and json_of(bad_role)["error"]["code"] == "invalid_input"
    listed = json_of(cli("agents", "list", "--db", store_url, "--json"))
    assert [a["agent_id"] for a in listed] == ["alice", "otto", "vera"]
    shown = cli("agents", "show", "alice", "--db", store_url)
    assert shown.returncode == 0 and "trust_score" in shown.stdout


def test_refused_claims_exit_5_and_run_nothing(store_url: str, tmp_path: Path) -> None:
    setup_agents(store_url)
    marker = tmp_path / "pwned"
    cases = [
        ({"cmd": f"sh -c 'touch {marker}'"}, "command_not_allowed"),
        ({"cmd": f'python -c \'open("{marker}", "w")\''}, "command_not_allowed"),
        ({"verifier": "otto"}, "verifier_role_forbidden"),
        ({"verifier": "alice"}, "self_verification"),
        ({"claim": "{not json"}, "invalid_claim"),
        ({"claim": '{"retrun_code": 0}'}, "invalid_claim"),
    ]
    for kwargs, code in cases:
        result = verify(store_url, "--json", **kwargs)
        assert result.returncode == 5, (kwargs, result.stdout, result.stderr)
        assert json_of(result)["error"]["code"] == code
    assert not marker.exists()
    assert json_of(cli("claims", "history", "alice", "--db", store_url, "--json")) == []
    missing = verify(store_url, "--json", verifier="nobody")
    assert missing.returncode == 2 and json_of(missing)["error"]["code"] == "agent_not_found"
    human = verify(store_url, cmd="rm -rf /")
    assert human.returncode == 5 and "allow-list" in human.stderr


def test_project_dir_option(store_url: str, tmp_path: Path) -> None:
    setup_agents(store_url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "check.py").write_text("print('{\"score\": 10}')\n")
    result = verify(
        store_url,
        "--json",
        "--project-dir",
        str(project),
        claim='{"metrics": {"score": 10}}',
        cmd="python check.py",
    )
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["actual"]["metrics"] == {"score": 10.0}
    # A project directory that holds the signing key (tmp_path/keys here) is refused.
    shown = verify(store_url, "--json", "--project-dir", str(tmp_path), cmd="python check.py")
    assert shown.returncode == 5, shown.stdout
    assert json_of(shown)["error"]["code"] == "sandbox_unavailable"


def test_refused_arguments_exit_5_naming_the_argument(store_url: str, tmp_path: Path) -> None:
    setup_agents(store_url)
    victim = tmp_path / "victim.py"
    victim.write_text("x  =  1\n")
    for cmd, argument in (
        (f"ruff check --fix {victim}", "--fix"),
        # (a path under /tmp would be the sandbox's private scratch directory)
        ("coverage erase --data-file=/srv/app/.coverage", "--data-file=/srv/app/.coverage"),
        ("python -m timeit pass", "-m timeit"),
    ):
        result = verify(store_url, "--json", cmd=cmd)
        assert result.returncode == 5, (cmd, result.stdout)
        error = json_of(result)["error"]
        assert error["code"] == "command_not_allowed" and repr(argument) in error["message"]
    assert victim.read_text() == "x  =  1\n"
    assert json_of(cli("claims", "history", "alice", "--db", store_url, "--json")) == []


def test_claims_make_then_verify_by_id(store_url: str) -> None:
    setup_agents(store_url)
    made = cli(
        "claims", "make", "--agent", "alice", "--type", "custom", "--claim",
        '{"output_contains": "ok"}', "--command", "echo ok", "--db", store_url, "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    claim_id = json_of(made)["claim_id"]
    own = cli("claims", "verify", "--id", claim_id, "--verifier", "alice", "--db", store_url)
    assert own.returncode == 5 and "cannot verify its own claim" in own.stderr
    both = cli("claims", "verify", "--id", claim_id, "--agent", "alice", "--verifier", "vera",
               "--db", store_url)  # fmt: skip
    assert both.returncode == 3 and "--id, or all of" in both.stderr
    result = cli("claims", "verify", "--id", claim_id, "--verifier", "vera", "--db", store_url)
    assert result.returncode == 0, result.stderr
    assert "accurate" in result.stdout and "trust of alice" in result.stdout
    missing = cli("claims", "verify", "--id", "nope", "--verifier", "vera", "--db", store_url)
    assert missing.returncode == 2


def test_recorded_text_is_shown_as_recorded(store_url: str) -> None:
    """A command holding brackets is shown whole, not read as Rich markup (which dropped
    ``[a-z]`` and ``[bold]`` from the evidence table); stats lists the last verifications."""
    setup_agents(store_url)
    cmd = 'echo "[a-z]" [bold]x[/bold] [/]'
    ran = verify(store_url, claim='{"output_contains": "[a-z]"}', cmd=cmd)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    table = cli("claims", "history", "alice", "--db", store_url)
    assert table.returncode == 0 and cmd in table.stdout, table.stdout
    stats = cli("claims", "stats", "alice", "--db", store_url)
    assert stats.returncode == 0, stats.stderr
    recent = json_of(cli("claims", "stats", "alice", "--db", store_url, "--json"))
    assert recent["recent_verifications"][0]["verification_id"] in stats.stdout


def test_a_claim_moves_trust_once_and_claims_show_flags_a_disagreement(
    store_url: str, tmp_path: Path
) -> None:
    setup_agents(store_url)
    cli("agents", "add", "vic", "--namespace", "team", "--db", store_url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "check.py").write_text("raise SystemExit(0)\n")
    made = cli(
        "claims", "make", "--agent", "alice", "--type", "custom", "--claim",
        '{"return_code": 0}', "--command", "python check.py", "--db", store_url, "--json",
    )  # fmt: skip
    claim_id = json_of(made)["claim_id"]

    def verify_by(verifier: str):  # type: ignore[no-untyped-def]
        return cli("claims", "verify", "--id", claim_id, "--verifier", verifier,
                   "--project-dir", str(project), "--db", store_url, "--json")  # fmt: skip

    first = verify_by("vera")
    assert first.returncode == 0 and json_of(first)["counted"] is True
    for _ in range(3):
        again = json_of(verify_by("vic"))
        assert again["counted"] is False and again["new_trust_score"] == 0.55
    (project / "check.py").write_text("raise SystemExit(1)\n")
    flipped = verify_by("vera")
    assert flipped.returncode == 1 and json_of(flipped)["disagrees"] is True
    shown = cli("claims", "show", claim_id, "--db", store_url, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json_of(shown)
    assert doc["disagreements"] == 1 and len(doc["verifications"]) == 5
    assert [v["counted"] for v in doc["verifications"]] == [True, False, False, False, False]
    human = cli("claims", "show", claim_id, "--db", store_url)
    assert human.returncode == 0 and "DISAGREES" in human.stdout and "counted" in human.stdout
    trust = cli("trust", "show", "alice", "--db", store_url)
    assert trust.returncode == 0, trust.stdout  # flagged, not failed
    assert "1 re-verification(s) judged a claim otherwise" in trust.stdout
    doc = json_of(cli("trust", "show", "alice", "--db", store_url, "--json"))
    assert doc["trust_score"] == 0.55 and doc["verifications"] == 1
    assert [f["claim_id"] for f in doc["trust_log"]["disagreements"]] == [claim_id]
    assert cli("claims", "show", "nope", "--db", store_url).returncode == 2


def test_claim_types_constrain_their_commands_exit_5(store_url: str) -> None:
    setup_agents(store_url)
    echoed = verify(store_url, "--json", claim='{"metrics": {"p95_ms": 50}}',
                    cmd="echo '{\"p95_ms\": 50}'")  # fmt: skip
    assert echoed.returncode == 5, echoed.stdout
    assert json_of(echoed)["error"]["code"] == "command_unfit_for_claim"
    not_tests = cli(
        "claims", "make", "--agent", "alice", "--type", "test_result", "--claim",
        '{"return_code": 0}', "--command", "echo 5 passed", "--db", store_url,
    )  # fmt: skip
    assert not_tests.returncode == 5 and "must run a test runner" in not_tests.stderr
    assert json_of(cli("claims", "history", "alice", "--db", store_url, "--json")) == []

"""The public surface and the layer rules of ARCHITECTURE.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import affidavit

SRC = Path(affidavit.__file__).parent

# What each layer may import (besides itself). Dependencies point downward only.
ALLOWED = {
    "core": set(),
    "store": {"core"},
    "runtime": {"core", "store"},
    "verify": {"core", "store", "runtime"},
    # the transparency log: beside verify (packs carry its proofs)
    "tlog": {"core", "store", "runtime"},
    "packs": {"core", "store", "runtime", "verify", "tlog"},
    "claims": {"core", "store", "runtime", "verify"},
    # the API serves every layer below it; the package root only for its version
    "api": {"core", "store", "runtime", "verify", "tlog", "packs", "claims", "affidavit"},
}


def test_public_api() -> None:
    assert sorted(affidavit.__all__) == sorted(
        [
            "AffidavitError",
            "Agent",
            "AgentContext",
            "AgentNotFound",
            "AuthorizationError",
            "Budget",
            "CanonicalizationError",
            "ClaimRejected",
            "ClaimService",
            "ClaimType",
            "ClaimVerdict",
            "CommandNotAllowed",
            "CompensatableError",
            "ConfigError",
            "Confirmation",
            "ConfirmationContext",
            "ConflictError",
            "EventType",
            "FencedError",
            "FileVerifier",
            "HttpVerifier",
            "JobFilter",
            "JobNotFound",
            "JobRecord",
            "Limit",
            "NewEvent",
            "Plan",
            "PlanError",
            "PublicKey",
            "ReplayContext",
            "ReplayContextBuilder",
            "ReplayError",
            "ResourceVerifier",
            "RetryableError",
            "Runtime",
            "SandboxConfig",
            "Seal",
            "SignalPayloadError",
            "SignalRejected",
            "SigningKey",
            "SqlRowVerifier",
            "StateChange",
            "Store",
            "StoreError",
            "StoreUnavailable",
            "StoredEvent",
            "Tool",
            "ToolCallError",
            "ToolContext",
            "ToolRegistry",
            "TrustPolicy",
            "ValidationError",
            "VerificationError",
            "WaitTimeout",
            "__version__",
            "agent",
            "canonical",
            "canonical_sha256",
            "chain_root",
            "check_stored_chain",
            "execution_hash",
            "load_tools",
            "open_store",
            "pure",
            "record_file",
            "register_verifier",
            "sha256_hex",
            "sha256_prefixed",
            "tool",
            "verify_events",
            "verify_job",
        ]
    )
    for name in affidavit.__all__:
        assert hasattr(affidavit, name), name


def imported_layers(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "affidavit":
                found.add(parts[1] if len(parts) > 1 else "affidavit")
    return found


def test_layers_import_downward_only() -> None:
    violations = []
    for layer, allowed in ALLOWED.items():
        for path in (SRC / layer).rglob("*.py"):
            bad = imported_layers(path) - allowed - {layer}
            if bad:
                violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert violations == []


def test_every_error_has_a_hint() -> None:
    from affidavit.core import errors

    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, errors.AffidavitError):
            if obj in (errors.AffidavitError,):
                continue
            assert obj.default_hint, f"{name} has no hint"


def test_running_jobs_does_not_import_claims_or_verification() -> None:
    """A worker or `affidavit run` starts without the claim models and Verification Mode; both
    load on first use of their names."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from affidavit import Runtime, ToolRegistry, pure, tool\n"
        "print(sorted(m for m in ('affidavit.claims', 'affidavit.verify') if m in sys.modules))\n"
        "import affidavit\n"
        "affidavit.verify_job, affidavit.ClaimService\n"
        "print(sorted(m for m in ('affidavit.claims', 'affidavit.verify') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "['affidavit.claims', 'affidavit.verify']"]


def test_the_cli_starts_without_packs_or_the_claim_service() -> None:
    """Help for the whole program imports the whole command tree; the pack codecs (with their
    schemas) and the claim service load only in the commands that use them."""
    import subprocess
    import sys

    heavy = ("affidavit.packs", "affidavit.claims.service", "affidavit.claims.sandbox")
    code = (
        "import sys\n"
        "import affidavit.cli.main\n"
        "affidavit.cli.main.load_commands()\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]"]


def test_the_claims_verdicts_old_name_is_a_deprecated_alias() -> None:
    """``VerificationResult`` was the claims verdict's name (a job's verification result has
    the same name in ``affidavit.verify``): kept for one release, warning on each use."""
    from affidavit import claims

    for package in (affidavit, claims):
        with pytest.warns(DeprecationWarning, match="ClaimVerdict"):
            old = package.VerificationResult
        assert old is claims.ClaimVerdict
        assert "VerificationResult" not in package.__all__
    assert affidavit.ClaimVerdict is claims.ClaimVerdict


def test_the_runtime_facade() -> None:
    """``affidavit.runtime`` exports its public surface by name (imported on first use); each
    name is the object its defining module holds."""
    import importlib

    import affidavit.runtime as runtime

    assert set(runtime.__all__) == set(runtime._LAZY)
    for name in runtime.__all__:
        module = importlib.import_module(runtime._LAZY[name])
        assert getattr(runtime, name) is getattr(module, name)
    assert runtime.Runtime is affidavit.Runtime and runtime.tool is affidavit.tool
    with pytest.raises(AttributeError):
        _ = runtime.no_such_name


def test_no_package_imports_another_packages_private_modules() -> None:
    """``affidavit.runtime``, ``affidavit.verify``, ``affidavit.packs``, ``affidavit.tlog`` and
    ``affidavit.store`` are used through their facades: a module outside a package never imports
    one of its ``_``-prefixed modules (the top-level ``affidavit`` facade aside)."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "__init__.py":
            continue
        rel = path.relative_to(SRC).parts
        home = rel[0] if len(rel) > 1 else None
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                parts = module.split(".")
                private = len(parts) > 2 and parts[2].startswith("_")
                if parts[0] == "affidavit" and private and parts[1] != home:
                    offenders.append(f"{path.relative_to(SRC)}: {module}")
    assert offenders == []


def test_a_command_loads_only_its_own_module() -> None:
    """`affidavit worker` registers the runtime's commands alone: not the server, the claims,
    the packs, the witness (with its HTTP client) or the verifier's commands."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from affidavit.cli.main import load_commands\n"
        "app = load_commands(['--max-input-bytes', '9', 'worker', '--help'])\n"
        "names = sorted(c.name for c in app.registered_commands if c.name)\n"
        "print(names)\n"
        "print(sorted(m for m in ('affidavit.api', 'affidavit.claims', 'affidavit.packs',"
        " 'affidavit.cli.verify_cmds', 'affidavit.cli.serve_cmds', 'httpx') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["['cancel', 'demo', 'resume', 'run', 'signal', 'submit', 'worker']", "[]"]


def test_every_command_is_found_where_the_table_says() -> None:
    """COMMAND_MODULES names every top-level command but the program's own (``db``,
    ``demo``), and loading by a name registers that name."""
    import typer

    from affidavit.cli import main

    def top_level(app: typer.Typer) -> set[str]:
        commands = {c.name for c in app.registered_commands if c.name}
        return commands | {g.name for g in app.registered_groups if g.name}

    everything = top_level(main.load_commands())
    assert everything == set(main.COMMAND_MODULES) | {"db", "demo"}
    for name, source in main.COMMAND_MODULES.items():
        module, _, group = source.partition(":")
        fresh = typer.Typer()
        if group:
            assert group.removesuffix("_app") == name
        else:
            __import__(f"affidavit.cli.{module}", fromlist=["register"]).register(fresh)
            assert name in top_level(fresh), (name, source)

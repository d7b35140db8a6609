"""The public surface and the layer rules (README.md, Layout)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import affidavit

SRC = Path(affidavit.__file__).parent

# What each package (and top-level module) may import besides itself. Dependencies point downward
# only; the faces (FACES) sit on top and may import anything.
ALLOWED = {
    "core": set(),
    "store": {"core"},
    # the job's record as data: read by everything above, written by the runtime
    "record": {"core", "store"},
    "runtime": {"core", "store", "record"},
    # Verification Mode reads the log on its own (never through the runtime's replay)
    "verify": {"core", "store", "record"},
    # the transparency log: beside verify (packs carry its proofs)
    "tlog": {"core", "store", "record"},
    "packs": {"core", "store", "record", "verify", "tlog"},
    # data subjects and their erasure: signed receipts logged in the transparency log
    "privacy": {"core", "store", "record", "tlog"},
    "claims": {"core", "store", "record", "verify"},
    # retention archives finished jobs as packs before it removes them from the live store
    "retention": {"core", "store", "packs"},
    # built on the public API (``import affidavit``) only
    "integrations": {"affidavit"},
    "examples": {"affidavit", "runtime"},
    "demo": {"core", "store", "runtime", "verify", "examples"},
    # the package root: the public API's facade, and ``python -m affidavit``
    "affidavit": {"core", "store", "record", "runtime", "verify", "claims", "client"},
    "__main__": {"cli"},
    # what the faces share: API keys and roles, request limits, the error → exit code / status table
    "faces": {"core", "store"},
    # the Python client of a served affidavit: the API's models and the errors, never the engine
    "client": {"core", "api", "faces"},
}
# The faces: the command line, the HTTP API and the MCP server (``affidavit mcp``, in mcp/), which
# is a face wherever it lives — every module that imports the MCP SDK's server side is one.
FACES = {"api", "cli", "mcp"}


def module_key(path: Path) -> str:
    """The row of ``path``: its package, or a top-level module's name (``affidavit`` for the
    package root)."""
    rel = path.relative_to(SRC)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return "affidavit" if rel.name == "__init__.py" else rel.stem


def is_mcp_server(path: Path) -> bool:
    """Whether ``path`` is part of the MCP server: it imports ``mcp.server`` (the SDK's server
    side; the MCP client integration imports only ``mcp`` and ``mcp.client``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        if any(n == "mcp.server" or n.startswith("mcp.server.") for n in names):
            return True
    return False


def test_public_api() -> None:
    assert sorted(affidavit.__all__) == sorted(
        [
            "AffidavitError",
            "Agent",
            "AgentContext",
            "AgentNotFound",
            "AsyncClient",
            "AuthorizationError",
            "Budget",
            "CanonicalizationError",
            "ChildResult",
            "ClaimRejected",
            "ClaimService",
            "ClaimType",
            "ClaimVerdict",
            "Client",
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
            "StreamError",
            "StreamLimit",
            "Tool",
            "ToolCallError",
            "ToolCancelled",
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
            "mcp_reconcile",
            "open_store",
            "pure",
            "queue",
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
    faces = []
    for path in sorted(SRC.rglob("*.py")):
        key = module_key(path)
        if key in FACES or is_mcp_server(path):
            faces.append(key)
            continue
        bad = imported_layers(path) - ALLOWED[key] - {key}
        if bad:
            violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert violations == []
    assert set(faces) >= FACES  # (each face was found)


def test_every_package_has_a_row() -> None:
    """Each package and top-level module is a layer of ALLOWED or a face: a new one must say
    what it may import."""
    keys = {module_key(p) for p in SRC.rglob("*.py")}
    assert keys - FACES == set(ALLOWED)


def test_only_the_faces_demo_and_examples_import_the_runtime() -> None:
    """The runtime is the engine: verify, tlog, packs and claims read the record through
    ``affidavit.record``; only the faces, the demo, the examples and the public API's facade
    (which integrations build on) import it."""
    assert {key for key, allowed in ALLOWED.items() if "runtime" in allowed} == {
        "examples",
        "demo",
        "affidavit",
    }
    for reader in ("verify", "tlog", "packs", "claims", "record"):
        assert "runtime" not in ALLOWED[reader]


def test_the_readme_layout_lists_every_package() -> None:
    """README.md's Layout section names every package and top-level module the layer rows
    cover (the faces included)."""
    readme = (SRC.parents[1] / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    listed = set()
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            listed.add(line.split()[0].rstrip("/").removesuffix(".py"))
    expected = (set(ALLOWED) | FACES) - {"affidavit", "__main__"}
    assert listed == expected


def test_integrations_build_on_the_public_api_only() -> None:
    """``affidavit.integrations`` holds what a user could have written: its modules import
    ``affidavit``'s public names (``affidavit.__all__``) and each other, nothing deeper."""
    public = set(affidavit.__all__)
    offenders = []
    for path in sorted((SRC / "integrations").rglob("*.py")):
        where = path.relative_to(SRC)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                offenders += [
                    f"{where}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("affidavit.")
                    and not a.name.startswith("affidavit.integrations")
                ]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "affidavit":
                    offenders += [
                        f"{where}: from affidavit import {a.name}"
                        for a in node.names
                        if a.name not in public
                    ]
                elif node.module.startswith("affidavit.") and not node.module.startswith(
                    "affidavit.integrations"
                ):
                    offenders.append(f"{where}: from {node.module} import ...")
            elif (  # `import affidavit` then `affidavit.NAME`
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "affidavit"
                and node.attr not in public
            ):
                offenders.append(f"{where}: affidavit.{node.attr}")
    assert offenders == []


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


def test_the_record_facade() -> None:
    """``affidavit.record`` exports the job's record by name (imported on first use); each name
    is the object its defining module holds, and none of them is the runtime's any more."""
    import importlib

    import affidavit.record as record
    import affidavit.runtime as runtime

    assert set(record.__all__) == set(record._LAZY)
    for name in record.__all__:
        module = importlib.import_module(record._LAZY[name])
        assert getattr(record, name) is getattr(module, name)
        assert name not in runtime.__all__, name
    assert record.ReplayContext is affidavit.ReplayContext
    with pytest.raises(AttributeError):
        _ = record.no_such_name


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
    """`affidavit worker` registers its own command alone: not the server, the claims, the
    packs, the witness (with its HTTP client) or the verifier's commands."""
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
    assert out == ["['worker']", "[]"]


def test_every_command_is_found_where_the_table_says() -> None:
    """COMMAND_MODULES names every top-level command but the program's own (``db``,
    ``demo``), and loading by a name registers that name."""
    import importlib

    import typer

    from affidavit.cli import main

    def top_level(app: typer.Typer) -> set[str]:
        commands = {c.name for c in app.registered_commands if c.name}
        return commands | {g.name for g in app.registered_groups if g.name}

    everything = top_level(main.load_commands())
    assert everything == set(main.COMMAND_MODULES) | {"db", "demo"}
    for name, source in main.COMMAND_MODULES.items():
        module, _, attribute = source.partition(":")
        fresh = typer.Typer()
        if attribute.endswith("_app"):
            assert attribute.removesuffix("_app") == name
        elif attribute:
            assert callable(getattr(importlib.import_module(f"affidavit.cli.{module}"), attribute))
        else:
            __import__(f"affidavit.cli.{module}", fromlist=["register"]).register(fresh)
            assert name in top_level(fresh), (name, source)


def test_read_commands_and_submit_import_only_what_they_use(tmp_path: Path) -> None:
    """`jobs list` loads neither the runtime, the verifier nor the signing library;
    `submit` enqueues without the worker machinery (runner, step executor, worker)."""
    import json
    import subprocess
    import sys

    from affidavit.examples import refund

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(refund.PLAN))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    job_input = json.dumps({"data_dir": str(tmp_path), "order_id": "o1"})
    heavy = (
        "affidavit.runtime._worker",
        "affidavit.runtime._runner",
        "affidavit.runtime._step_executor",
        "affidavit.verify",
        "affidavit.cli.run_cmds",
        "cryptography",
    )
    code = (
        "import sys\n"
        "from affidavit.cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)\n"
    )

    def loaded(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, *args, "--db", url, "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stderr.strip().splitlines()[-1]

    submitted = ("submit", str(plan), "--tools", "affidavit.examples.refund", "--input", job_input)
    assert loaded(*submitted) == "[]"
    assert loaded("jobs", "list") == "[]"


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module a reader cannot hold at once is split where its parts meet (STYLE.md)."""
    long = {
        str(path.relative_to(SRC)): n
        for path in SRC.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long

"""Argument policies: each allowed program's options and modules, checked before anything runs.
The attacks are ones that passed a check of program names alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.claims.sandbox import SandboxConfig, parse_command
from affidavit.core.errors import CommandNotAllowed
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded

# (command, the argument the refusal names)
REFUSED = [
    ("python -m timeit -s \"import os; os.remove('{p}')\" pass", "-m timeit"),
    ("python3 -m pip.__main__ install six", "-m pip.__main__"),
    ("python -m pip install six", "install"),
    ("python -mhttp.server", "-m http.server"),
    ("python -I -m code", "-m code"),
    ("coverage run -m timeit pass", "-m timeit"),
    ("coverage run -m pip install six", "install"),
    ("coverage erase --data-file={p}", "--data-file={p}"),
    ("coverage erase --data-f={p}", "--data-f={p}"),
    ("coverage run --data-file {p} check.py", "--data-file {p}"),
    ("coverage combine", "combine"),
    ("coverage xml -o {p}", "-o {p}"),
    ("coverage html -d {p}", "-d {p}"),
    ("pytest --junitxml={p}", "--junitxml={p}"),
    ("pytest --junit-xml {p}", "--junit-xml {p}"),
    ("pytest --basetemp={p}", "--basetemp={p}"),
    ("python -m pytest --log-file={p}", "--log-file={p}"),
    ("pytest -o cache_dir={p}", "-o cache_dir={p}"),
    ("pytest --cov-report=xml:{p}", "--cov-report=xml:{p}"),
    ("pytest --debug={p}", "--debug={p}"),
    ("ruff check --fix .", "--fix"),
    ("ruff check --unsafe-fixes --fix .", "--unsafe-fixes"),
    ("ruff check --add-noqa .", "--add-noqa"),
    ("ruff format .", "format"),
    ("ruff clean", "clean"),
    ("ruff check --output-file {p} .", "--output-file {p}"),
    ("black .", "black"),
    ("isort .", "isort"),
    ("mypy --install-types --non-interactive .", "--install-types"),
    ("mypy --junit-xml {p} .", "--junit-xml {p}"),
    ("mypy --cache-dir={p} .", "--cache-dir={p}"),
    ("flake8 --output-file={p} .", "--output-file={p}"),
    ("bandit -r . -o {p}", "-o {p}"),
    ("pip --log {p} list", "--log {p}"),
    ("pip install --target /tmp/x six", "install"),
]

ALLOWED = [
    "python check.py -c x",
    "python -m pytest -q",
    "python3 -B -m mypy .",
    "pytest -q --junitxml=/tmp/report.xml",
    "pytest --co -q",
    "pytest -o addopts=-q",
    "pytest --cov-report=term-missing",
    "coverage run --data-file=/tmp/.coverage -m pytest -q",
    "coverage report --data-file=/tmp/.coverage",
    "coverage combine --keep --data-file=/tmp/c",
    "coverage xml -o /tmp/coverage.xml",
    "ruff check .",
    "ruff format --check .",
    "ruff format --diff .",
    "black --check .",
    "isort --check-only --diff .",
    "mypy --strict src",
    "bandit -r . -o /tmp/b.json -f json",
    "pip list",
    "python -m pip freeze",
]


@pytest.mark.parametrize(("template", "argument"), REFUSED)
def test_refused_before_anything_runs_naming_the_argument(template: str, argument: str) -> None:
    target = "/srv/project/victim.py"  # a file of the checked project
    with pytest.raises(CommandNotAllowed) as info:
        parse_command(template.format(p=target), SandboxConfig())
    assert info.value.code == "command_not_allowed"
    assert repr(argument.format(p=target)) in info.value.message


@pytest.mark.parametrize("text", ALLOWED)
def test_reading_checks_and_scratch_writes_are_allowed(text: str) -> None:
    assert parse_command(text, SandboxConfig()).argv == tuple(text.split())


def test_without_the_sandbox_nothing_may_write_files() -> None:
    config = SandboxConfig(isolation="none")
    with pytest.raises(CommandNotAllowed, match="no private scratch"):
        parse_command("pytest --junitxml=/tmp/report.xml", config)
    assert parse_command("pytest -q", config).argv[0] == "pytest"


def test_modules_are_configurable() -> None:
    config = SandboxConfig(allowed_modules=frozenset({"json.tool"}))
    assert parse_command("python -m json.tool data.json", config).argv[1] == "-m"
    with pytest.raises(CommandNotAllowed, match="-m pytest"):
        parse_command("python -m pytest", config)
    # Inline code allowed: any module runs (it is code anyway), writes are still policed.
    inline = SandboxConfig(allow_inline_code=True)
    assert parse_command("python -m timeit pass", inline).argv[2] == "timeit"
    with pytest.raises(CommandNotAllowed, match="--junitxml"):
        parse_command("pytest --junitxml=/work/x.xml", inline)


@pytest.fixture
def svc(store: Store, tmp_path: Path) -> ClaimService:
    project = tmp_path / "project"
    project.mkdir()
    service = make_service(store, project=project, isolation="none")
    service.add_agent("alice", namespace="team")
    service.add_agent("vera", namespace="team")
    return service


@pytest.mark.parametrize(
    "template",
    [
        "coverage erase --data-file={p}",
        "pytest --junitxml={p}",
        "ruff check --fix {p}",
        "python -m timeit -s \"import os; os.remove('{p}')\" pass",
    ],
)
def test_a_refused_command_leaves_the_file_and_the_record_alone(
    svc: ClaimService, tmp_path: Path, template: str
) -> None:
    # Unsandboxed on purpose: the policy alone must stop these.
    victim = tmp_path / "victim.py"
    victim.write_text("import os\nx  =  1\n")
    with pytest.raises(CommandNotAllowed):
        svc.verify_claim("alice", "custom", {}, template.format(p=victim), "vera")
    assert victim.read_text() == "import os\nx  =  1\n"
    assert nothing_recorded(svc)

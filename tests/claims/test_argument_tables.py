"""The per-program argument tables: what is not in a program's table is refused, and every
option value is checked for its shape. Each refused command here passed the earlier policy
(which checked known-bad options and skipped the values of the others)."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.claims.sandbox import SandboxConfig, parse_command
from affidavit.core.errors import CommandNotAllowed
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded

STDLIB = sysconfig.get_paths()["stdlib"]
CODE = "import os; os.remove('{p}')"

# (command, the argument the refusal names); {p} is a file of the checked project.
BYPASSES = [
    (f'python {STDLIB}/timeit.py -s "{CODE}" pass', f"{STDLIB}/timeit.py"),
    (f'python3 -B {STDLIB}/pdb.py -c "{CODE}"', f"{STDLIB}/pdb.py"),
    (
        f'python {STDLIB}/../{os.path.basename(STDLIB)}/timeit.py -s "{CODE}" pass',
        f"{STDLIB}/../{os.path.basename(STDLIB)}/timeit.py",
    ),
    (f'coverage run -am timeit -s "{CODE}" pass', "-m timeit"),
    (f'coverage run --branch -am timeit -s "{CODE}" pass', "-m timeit"),
    (f'coverage run {STDLIB}/timeit.py -s "{CODE}" pass', f"{STDLIB}/timeit.py"),
    ("pip --proxy http://127.0.0.1:9 install six", "--proxy"),
    ("pip --python /usr/bin/python3 list", "--python"),
    ("pytest -o addopts=--junitxml={p}", "-o addopts=--junitxml={p}"),
    ("pytest --override-ini=addopts='-q --basetemp={p}'", "--basetemp={p}"),
    ("pytest --debug {p}", "--debug {p}"),
    ("pytest --debug", "--debug"),
    ("pytest -p timeit", "-p timeit"),
    ("pytest --pyargs timeit", "--pyargs"),
    ("pytest --junit=/srv/x.xml", "--junit=/srv/x.xml"),
    ("ruff check --config 'fix = true' .", "--config fix = true"),
    ("ruff --config 'fix = true' check .", "--config fix = true"),
    ("mypy @args.txt", "@args.txt"),
    ("python -W ignore::foo.Bar check.py", "-W ignore::foo.Bar"),
    ("python -X pycache_prefix=/srv check.py", "-X pycache_prefix=/srv"),
    ("python -m unittest timeit", "timeit"),
    ("black --check --code=x --line-length=many .", "--line-length=many"),
    ("pytest ../../etc/passwd", "../../etc/passwd"),
    ("pytest -q --maxfail=1e9", "--maxfail=1e9"),
    ("ruff check --quiet=yes .", "--quiet=yes"),
    ("pytest --cov=../elsewhere", "--cov=../elsewhere"),
]


@pytest.mark.parametrize(("template", "argument"), BYPASSES)
def test_bypasses_of_the_earlier_policy_are_refused(template: str, argument: str) -> None:
    target = "/srv/project/victim.py"
    with pytest.raises(CommandNotAllowed) as info:
        parse_command(template.format(p=target), SandboxConfig())
    assert repr(argument.format(p=target)) in info.value.message, info.value.message


LEGITIMATE = [
    "python check.py --anything -s goes",
    "python -B -X dev -W error::DeprecationWarning check.py",
    "python -m unittest -v test_calc",
    "python -m unittest discover -s . -p 'test_*.py'",
    "pytest -q -x -ra --tb=short -k 'add and not wrong' test_calc.py::test_add",
    "pytest -o addopts='-q --junitxml=/tmp/r.xml' --maxfail 2 -n 0",
    "pytest --debug=/tmp/debug.log -W error::UserWarning",
    "ruff check --config pyproject.toml --select E,F --output-format json .",
    "ruff --config pyproject.toml check .",
    "mypy --strict --python-version 3.11 --config-file pyproject.toml calc.py",
    "coverage run -a --branch --data-file=/tmp/.c -m pytest -q",
    "coverage report -m --fail-under 50 --data-file=/tmp/.c",
    "pip show -f pytest",
    "pytest --cov --cov-report=term-missing -q",
    "pytest --cov=calc --cov-branch",
]


@pytest.mark.parametrize("text", LEGITIMATE)
def test_legitimate_checks_pass_the_tables(text: str, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\n")
    (tmp_path / "test_calc.py").write_text("def test_add():\n    pass\n")
    config = SandboxConfig(project_dir=str(tmp_path))
    assert parse_command(text, config).argv[0] == text.split()[0]


def test_a_symlink_in_the_project_to_a_stdlib_module_is_not_a_project_script(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench.py").symlink_to(Path(STDLIB) / "timeit.py")
    config = SandboxConfig(project_dir=str(tmp_path))
    with pytest.raises(CommandNotAllowed, match="resolves outside the project"):
        parse_command("python bench.py -s 'import os' pass", config)


@pytest.fixture
def svc(store: Store, tmp_path: Path) -> ClaimService:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.ruff]\n")
    service = make_service(store, project=project, isolation="none")
    service.add_agent("alice", namespace="team")
    service.add_agent("vera", namespace="team")
    return service


@pytest.mark.parametrize(
    "template",
    [
        f'python {STDLIB}/timeit.py -s "{CODE}" pass',
        f'coverage run -am timeit -s "{CODE}" pass',
        "pytest -o addopts=--junitxml={p}",
        "pytest --debug {p}",
        "ruff check --config 'fix = true' {p}",
    ],
)
def test_the_bypasses_leave_the_file_and_the_record_alone(
    svc: ClaimService, tmp_path: Path, template: str
) -> None:
    # Unsandboxed on purpose: the tables alone must stop these.
    victim = tmp_path / "victim.py"
    victim.write_text("import os\nx  =  1\n")
    with pytest.raises(CommandNotAllowed):
        svc.verify_claim("alice", "custom", {}, template.format(p=victim), "vera")
    assert victim.read_text() == "import os\nx  =  1\n"
    assert nothing_recorded(svc)

"""SQL lives in the store: no module outside ``affidavit/store/`` writes a statement, asks which
backend it runs on, or takes a ``sqlite:///`` URL apart — the store answers its own quirks (the
claims tables' operations, the row lock, what a URL names, the auditors' index)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import affidavit
from affidavit.core.errors import UnsupportedDatabaseURL
from affidavit.store import database_file, sqlite_path, url_backend

SRC = Path(affidavit.__file__).resolve().parent
STORE = SRC / "store"

# A statement as code writes one: the keywords in capitals, with what must follow them.
SQL = re.compile(
    r"\b(SELECT\b.*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|CREATE\s+(TEMP\s+)?(TABLE|INDEX|TRIGGER)|ALTER\s+TABLE|DROP\s+TABLE|PRAGMA\s+\w+"
    r"|BEGIN\s+IMMEDIATE|SET\s+(LOCAL\s+)?search_path|FOR\s+UPDATE)\b",
    re.S,
)
BACKEND_TEST = re.compile(r"\.backend\s*[!=]=")
URL_PARSING = re.compile(r"""(startswith|len)\(\s*["']sqlite:///""")
# The one place below the store that reads a URL: core's default signing-key location (beside
# a SQLite file) is needed by layers that may not import the store's modules from core; it
# only finds the file's directory and opens nothing.
URL_PARSING_ALLOWED = {"core/signing.py"}


def _outside_store() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if STORE not in p.parents]


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (prose may name a statement)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _string_parts(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string literal of ``tree`` but docstrings, an f-string as its text with ``{}`` for
    each value (so that ``f"SELECT {cols} FROM t"`` reads as a statement)."""
    skip = _docstrings(tree)
    inner = set()
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                for v in node.values
            )
            inner.update(id(v) for v in node.values)
            parts.append((node.lineno, text))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip | inner
        ):
            parts.append((node.lineno, node.value))
    return parts


def test_the_pattern_finds_what_it_is_for() -> None:
    """The checks below would see a statement, a backend test and URL parsing (so that their
    passing means something)."""
    code = (
        'rows = tx.query(f"SELECT {COLS} FROM agents WHERE agent_id = ?{lock}", (a,))\n'
        'tx.execute("UPDATE agents SET trust_score = ? WHERE agent_id = ?", (s, a))\n'
        'lock = " FOR UPDATE" if store.backend == "postgresql" else ""\n'
        'if url.startswith("sqlite:///"): pass\n'
    )
    tree = ast.parse(code)
    assert [line for line, text in _string_parts(tree) if SQL.search(text)] == [1, 2, 3]
    assert BACKEND_TEST.search(code) and URL_PARSING.search(code)
    assert not SQL.search("Select the rows from the log, then update the set of keys.")


def test_no_sql_outside_the_store() -> None:
    found = []
    for path in _outside_store():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _string_parts(tree):
            if SQL.search(text):
                found.append(f"{path.relative_to(SRC)}:{line}: {text[:60]!r}")
    assert found == []


def test_no_backend_names_or_url_parsing_outside_the_store() -> None:
    found = []
    for path in _outside_store():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            allowed = str(path.relative_to(SRC)) in URL_PARSING_ALLOWED
            if BACKEND_TEST.search(line) or (URL_PARSING.search(line) and not allowed):
                found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert found == []


def test_the_store_says_what_a_url_names(tmp_path: Path) -> None:
    """Which backend a URL names and which local file, without opening anything (a SQLite store
    opened would create a missing file)."""
    url = f"sqlite:///{tmp_path}/sub/affidavit.db?mode=x"
    assert url_backend(url) == "sqlite"
    assert sqlite_path(url) == f"{tmp_path}/sub/affidavit.db"
    assert database_file(url) == (tmp_path / "sub" / "affidavit.db").resolve()
    assert not (tmp_path / "sub").exists()
    assert database_file("sqlite:///:memory:") is None
    assert database_file("sqlite:///") is None
    for pg in ("postgresql://root@127.0.0.1/test", "postgres://h/db"):
        assert url_backend(pg) == "postgresql"
        assert sqlite_path(pg) is None and database_file(pg) is None
    with pytest.raises(UnsupportedDatabaseURL):
        url_backend("mysql://h/db")

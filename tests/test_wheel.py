"""The wheel `python -m build` makes holds what an installed affidavit reads at run time: every
module, the SQL migrations of both backends, the packs' JSON schemas and the trace page's
static files, with the `affidavit` command; and nothing of the tests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import affidavit

SRC = Path(affidavit.__file__).parent
ROOT = SRC.parents[1]


def source_files() -> set[str]:
    """Every file of the package in the source tree, as the wheel names it."""
    return {
        str(path.relative_to(SRC.parent))
        for path in SRC.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_the_wheel_holds_the_package_and_its_data(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = tmp_path.glob("affidavit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = archive.read(metadata).decode()
    packaged = {n for n in names if n.startswith("affidavit/")}
    assert source_files() <= packaged
    for backend in ("sqlite", "postgres"):
        migrations = {n for n in packaged if n.startswith(f"affidavit/store/migrations/{backend}/")}
        assert f"affidavit/store/migrations/{backend}/0001_init.sql" in migrations
        assert all(n.endswith(".sql") for n in migrations)
    assert "affidavit/packs/schemas/pack_manifest.schema.json" in packaged
    assert {"page.html", "app.js", "style.css"} <= {
        n.rsplit("/", 1)[1] for n in packaged if n.startswith("affidavit/api/static/")
    }
    assert "affidavit = affidavit.cli.launch:main" in scripts
    for extra in ("pydantic-ai", "mcp", "otel"):
        assert f"Provides-Extra: {extra}" in meta
    assert not any(n.startswith("tests/") for n in names)

"""Where the running interpreter's own code lives: the directories a claim may not name as
"the project's" script or test path (``python /usr/lib/python3.11/timeit.py -s CODE`` runs
the standard library's ``timeit``, which runs code given on the command line)."""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def module_dirs() -> tuple[str, ...]:
    """The interpreter's prefixes and library directories (standard library, site-packages,
    scripts), of the virtualenv and of its base Python, resolved through symlinks."""
    found: set[str] = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    bases: tuple[dict[str, str], ...] = (
        {},
        {
            "base": sys.base_prefix,
            "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix,
        },
    )
    for scheme_vars in bases:
        paths = sysconfig.get_paths(vars=scheme_vars)
        found.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"))
    found.update(site.getsitepackages())
    with_user = site.getusersitepackages()
    if isinstance(with_user, str):
        found.add(with_user)
    return tuple(sorted({os.path.realpath(p) for p in found if p}))


def module_dir_of(path: str, project: str | None) -> str | None:
    """The interpreter directory ``path`` (already resolved) is inside, or ``None``. A
    directory that holds the project itself (a project under ``/usr/src``, say) does not
    count: the project's own files are the project's."""
    real_project = os.path.realpath(project) if project else None
    for directory in module_dirs():
        if real_project is not None and _inside(real_project, directory):
            continue
        if _inside(path, directory):
            return directory
    return None

"""Proof packs: RCE v0.1 export and offline verification (docs/packs.md).

Each name is imported on first use, so that verifying a pack does not load the exporter (which
reads a store and verifies the job first) and exporting does not load the pack verifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.packs._errors import PackArchiveError
    from affidavit.packs._tree import TreeVerdict, export_tree, verify_tree_packs
    from affidavit.packs.archive import (
        ArchiveLimits,
        PackArchive,
        read_pack_archive,
        write_members,
    )
    from affidavit.packs.export import (
        ExportResult,
        PackError,
        PackExistsError,
        TraceStateError,
        UnfinishedJobError,
        export_archive,
        export_pack,
        pack_archive,
    )
    from affidavit.packs.verify import PackVerdict, verify_pack, write_verdict

_LAZY = {
    "PackArchiveError": "affidavit.packs._errors",
    "TreeVerdict": "affidavit.packs._tree",
    "export_tree": "affidavit.packs._tree",
    "verify_tree_packs": "affidavit.packs._tree",
    "ArchiveLimits": "affidavit.packs.archive",
    "PackArchive": "affidavit.packs.archive",
    "read_pack_archive": "affidavit.packs.archive",
    "write_members": "affidavit.packs.archive",
    "ExportResult": "affidavit.packs.export",
    "PackError": "affidavit.packs.export",
    "PackExistsError": "affidavit.packs.export",
    "TraceStateError": "affidavit.packs.export",
    "UnfinishedJobError": "affidavit.packs.export",
    "export_archive": "affidavit.packs.export",
    "export_pack": "affidavit.packs.export",
    "pack_archive": "affidavit.packs.export",
    "PackVerdict": "affidavit.packs.verify",
    "verify_pack": "affidavit.packs.verify",
    "write_verdict": "affidavit.packs.verify",
}

__getattr__ = lazy_exports("affidavit.packs", _LAZY, globals())

__all__ = [
    "ArchiveLimits",
    "ExportResult",
    "PackArchive",
    "PackArchiveError",
    "PackError",
    "PackExistsError",
    "PackVerdict",
    "TraceStateError",
    "TreeVerdict",
    "UnfinishedJobError",
    "export_archive",
    "export_pack",
    "export_tree",
    "pack_archive",
    "read_pack_archive",
    "verify_pack",
    "verify_tree_packs",
    "write_members",
    "write_verdict",
]

"""Proof packs: RCE v0.1 export and offline verification (docs/packs.md)."""

from affidavit.packs._errors import PackArchiveError
from affidavit.packs._tree import TreeVerdict, export_tree, verify_tree_packs
from affidavit.packs.archive import ArchiveLimits, PackArchive, read_pack_archive, write_members
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

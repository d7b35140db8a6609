"""Proof packs: RCE v0.1 export and offline verification (PACK-FORMAT.md, docs/packs.md)."""

from affidavit.packs.export import (
    ExportResult,
    PackError,
    PackExistsError,
    UnfinishedJobError,
    export_pack,
)

__all__ = [
    "ExportResult",
    "PackError",
    "PackExistsError",
    "UnfinishedJobError",
    "export_pack",
]

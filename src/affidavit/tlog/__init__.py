"""The transparency log of seals: a store-wide RFC 6962 Merkle tree whose leaves are job seals,
published as C2SP checkpoints, served as tlog-tiles, cosigned by witnesses; and selective
disclosure of one step of a sealed job against its v2 seal.

See docs/transparency.md. Each name is imported on first use: the sequencer a worker runs does
not load the witness and its HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.store.audit_index import AuditStateError, JobIndex
    from affidavit.tlog._audit import AuditInterrupted, EntriesMismatch, Finding, leaf_job_id
    from affidavit.tlog._cosigned import Cosigned, earliest_cosigned, earliest_in_store
    from affidavit.tlog._disclose import (
        DISCLOSURE_TYPE,
        MAX_DISCLOSURE_BYTES,
        DisclosureCheck,
        NotDisclosable,
        StepNotFound,
        build_disclosure,
        disclose,
        encode_disclosure,
        verify_disclosure,
    )
    from affidavit.tlog._entries import (
        EntriesError,
        EntrySource,
        HttpEntries,
        StoreEntries,
        first_of_record,
    )
    from affidavit.tlog._fetch import LogClient, LogReadError
    from affidavit.tlog._keys import (
        LOG_KEY_ENV,
        LOG_ORIGIN_ENV,
        LogKey,
        configured_origin,
        default_log_key_path,
    )
    from affidavit.tlog._log import (
        LogError,
        NotInLog,
        TilePath,
        TransparencyLog,
        parse_tile_path,
        tile_path,
    )
    from affidavit.tlog._monitor import MONITOR_PROBLEMS, Monitor
    from affidavit.tlog._sequencer import Integrated, Sequencer
    from affidavit.tlog._verify import ProofCheck, check_proof, parse_leaf
    from affidavit.tlog._witness import (
        DuplicateJob,
        ForkDetected,
        MalformedLeaf,
        StepResult,
        Witness,
        WitnessError,
    )

_LAZY = {
    "DISCLOSURE_TYPE": "affidavit.tlog._disclose",
    "MAX_DISCLOSURE_BYTES": "affidavit.tlog._disclose",
    "DisclosureCheck": "affidavit.tlog._disclose",
    "NotDisclosable": "affidavit.tlog._disclose",
    "StepNotFound": "affidavit.tlog._disclose",
    "build_disclosure": "affidavit.tlog._disclose",
    "disclose": "affidavit.tlog._disclose",
    "encode_disclosure": "affidavit.tlog._disclose",
    "verify_disclosure": "affidavit.tlog._disclose",
    "Cosigned": "affidavit.tlog._cosigned",
    "earliest_cosigned": "affidavit.tlog._cosigned",
    "earliest_in_store": "affidavit.tlog._cosigned",
    "EntriesError": "affidavit.tlog._entries",
    "EntrySource": "affidavit.tlog._entries",
    "HttpEntries": "affidavit.tlog._entries",
    "StoreEntries": "affidavit.tlog._entries",
    "first_of_record": "affidavit.tlog._entries",
    "LOG_KEY_ENV": "affidavit.tlog._keys",
    "LOG_ORIGIN_ENV": "affidavit.tlog._keys",
    "LogKey": "affidavit.tlog._keys",
    "configured_origin": "affidavit.tlog._keys",
    "default_log_key_path": "affidavit.tlog._keys",
    "LogError": "affidavit.tlog._log",
    "NotInLog": "affidavit.tlog._log",
    "TilePath": "affidavit.tlog._log",
    "TransparencyLog": "affidavit.tlog._log",
    "parse_tile_path": "affidavit.tlog._log",
    "tile_path": "affidavit.tlog._log",
    "Integrated": "affidavit.tlog._sequencer",
    "Sequencer": "affidavit.tlog._sequencer",
    "ProofCheck": "affidavit.tlog._verify",
    "check_proof": "affidavit.tlog._verify",
    "parse_leaf": "affidavit.tlog._verify",
    "ForkDetected": "affidavit.tlog._witness",
    "DuplicateJob": "affidavit.tlog._witness",
    "MalformedLeaf": "affidavit.tlog._witness",
    "AuditInterrupted": "affidavit.tlog._audit",
    "EntriesMismatch": "affidavit.tlog._audit",
    "Finding": "affidavit.tlog._audit",
    "leaf_job_id": "affidavit.tlog._audit",
    "LogClient": "affidavit.tlog._fetch",
    "LogReadError": "affidavit.tlog._fetch",
    "AuditStateError": "affidavit.store.audit_index",
    "JobIndex": "affidavit.store.audit_index",
    "Monitor": "affidavit.tlog._monitor",
    "MONITOR_PROBLEMS": "affidavit.tlog._monitor",
    "StepResult": "affidavit.tlog._witness",
    "Witness": "affidavit.tlog._witness",
    "WitnessError": "affidavit.tlog._witness",
}

__getattr__ = lazy_exports("affidavit.tlog", _LAZY, globals())

__all__ = [
    "DISCLOSURE_TYPE",
    "LOG_KEY_ENV",
    "LOG_ORIGIN_ENV",
    "MAX_DISCLOSURE_BYTES",
    "MONITOR_PROBLEMS",
    "AuditInterrupted",
    "AuditStateError",
    "Cosigned",
    "DisclosureCheck",
    "DuplicateJob",
    "EntriesError",
    "EntriesMismatch",
    "EntrySource",
    "Finding",
    "ForkDetected",
    "HttpEntries",
    "Integrated",
    "JobIndex",
    "LogClient",
    "LogError",
    "LogKey",
    "LogReadError",
    "MalformedLeaf",
    "Monitor",
    "NotDisclosable",
    "NotInLog",
    "ProofCheck",
    "Sequencer",
    "StepNotFound",
    "StepResult",
    "StoreEntries",
    "TilePath",
    "TransparencyLog",
    "Witness",
    "WitnessError",
    "build_disclosure",
    "check_proof",
    "configured_origin",
    "default_log_key_path",
    "disclose",
    "earliest_cosigned",
    "earliest_in_store",
    "encode_disclosure",
    "first_of_record",
    "leaf_job_id",
    "parse_leaf",
    "parse_tile_path",
    "tile_path",
    "verify_disclosure",
]

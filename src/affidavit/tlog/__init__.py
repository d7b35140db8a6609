"""The transparency log of seals: a store-wide RFC 6962 Merkle tree whose leaves are job seals,
published as C2SP checkpoints, served as tlog-tiles, cosigned by witnesses.

See docs/transparency.md. Each name is imported on first use: the sequencer a worker runs does
not load the witness and its HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
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
    from affidavit.tlog._sequencer import Integrated, Sequencer
    from affidavit.tlog._verify import ProofCheck, check_proof, parse_leaf
    from affidavit.tlog._witness import ForkDetected, StepResult, Witness, WitnessError

_LAZY = {
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
    "StepResult": "affidavit.tlog._witness",
    "Witness": "affidavit.tlog._witness",
    "WitnessError": "affidavit.tlog._witness",
}

__getattr__ = lazy_exports("affidavit.tlog", _LAZY, globals())

__all__ = [
    "LOG_KEY_ENV",
    "LOG_ORIGIN_ENV",
    "ForkDetected",
    "Integrated",
    "LogError",
    "LogKey",
    "NotInLog",
    "ProofCheck",
    "Sequencer",
    "StepResult",
    "TilePath",
    "TransparencyLog",
    "Witness",
    "WitnessError",
    "check_proof",
    "configured_origin",
    "default_log_key_path",
    "parse_leaf",
    "parse_tile_path",
    "tile_path",
]

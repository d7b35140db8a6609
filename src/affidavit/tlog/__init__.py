"""The transparency log of seals: a store-wide RFC 6962 Merkle tree whose leaves are job seals,
published as C2SP checkpoints, served as tlog-tiles, cosigned by witnesses.

See docs/transparency.md.
"""

from __future__ import annotations

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

"""Retention: finished jobs leave the live store after a set age, each once its proof pack is
in the archive and verified; a tombstone and the seal stay (docs/storage.md, Retention)."""

from affidavit.retention._check import ArchivedCheck, JobArchived, archived_job, check_archived
from affidavit.retention._holds import hold_job, release_job
from affidavit.retention._policy import (
    RetentionError,
    RetentionPolicy,
    clear_policy,
    format_age,
    parse_age,
    read_policy,
    set_policy,
)
from affidavit.retention._run import Retention, RunReport, background_retention

__all__ = [
    "ArchivedCheck",
    "JobArchived",
    "Retention",
    "RetentionError",
    "RetentionPolicy",
    "RunReport",
    "archived_job",
    "background_retention",
    "check_archived",
    "clear_policy",
    "format_age",
    "hold_job",
    "parse_age",
    "read_policy",
    "release_job",
    "set_policy",
]

"""Why a pack cannot be exported, or an archive read as one."""

from __future__ import annotations

from affidavit.core.errors import AffidavitError


class PackError(AffidavitError):
    """A pack cannot be exported (the job is unfinished, the target exists, ...)."""

    code = "pack_error"
    default_hint = "See docs/packs.md."


class UnfinishedJobError(PackError):
    code = "job_not_finished"
    default_hint = "Only finished jobs export: wait for the job to complete or fail."


class PackExistsError(PackError):
    code = "pack_exists"
    default_hint = "Choose another directory, or pass --overwrite to replace it."


class TraceStateError(PackError):
    """A node of the job's trace is in a state the exporter has no step status for (or in a
    completed state without its output): a pack of it would misstate the job."""

    code = "pack_trace_state"
    default_hint = (
        "Every trace state maps to a step status (docs/packs.md); export with the affidavit "
        "version that ran the job."
    )


class PackArchiveError(AffidavitError):
    """What was given as a pack archive (``.tar.gz``) is not one: corrupted, too large, or
    holding what a pack does not (a link, an absolute path, ``..``)."""

    code = "invalid_pack_archive"
    default_hint = (
        "Give the .tar.gz that GET /api/jobs/{id}/pack or the export_pack MCP tool gives "
        "(one directory; regular files only), unaltered."
    )

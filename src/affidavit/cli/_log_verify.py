"""The checks and the report of ``affidavit log verify`` (:func:`affidavit.tlog.check_proof`)."""

from __future__ import annotations

from collections.abc import Sequence

from affidavit.cli import output
from affidavit.cli.common import opened
from affidavit.core.errors import JobNotFound
from affidavit.core.note import Verifier
from affidavit.tlog import ProofCheck


def check_job_proof(
    data: bytes,
    log_key: Verifier,
    witnesses: Sequence[Verifier],
    *,
    min_witnesses: int | None,
    job: str | None,
    db: str | None,
    log_url: str | None,
) -> tuple[ProofCheck, str | None]:
    """The verdict on a tlog-proof, and the job's ``sealed_at`` when ``job`` is given. With
    ``job``, the leaf must be the job's current seal; the leaves before it are read from
    ``log_url`` if given, else from the store; the earliest cosignature is looked for among the
    store's cosigned checkpoints too.

    Raises:
        JobNotFound: ``job`` has no seal.
        StoreError: the store cannot be read.
    """
    from affidavit.core.seal import log_leaf
    from affidavit.tlog import (
        EntrySource,
        HttpEntries,
        StoreEntries,
        check_proof,
        earliest_in_store,
    )

    http = HttpEntries(log_url) if log_url else None
    try:
        if job is None:
            return check_proof(
                data, log_key, witnesses, min_witnesses=min_witnesses, entries=http
            ), None
        with opened(db, read_only=True) as store:
            seal = store.get_seal(job)
            if seal is None:
                raise JobNotFound(f"job {job} has no seal")
            source: EntrySource = http if http is not None else StoreEntries(store)
            result = check_proof(
                data, log_key, witnesses, min_witnesses=min_witnesses,
                expected_leaf=log_leaf(seal), entries=source,
            )  # fmt: skip
            if result.ok and result.index is not None:
                from affidavit.core.checkpoint import TlogProof

                shown = TlogProof.parse(data).checkpoint
                result.earliest_cosigned = earliest_in_store(
                    store, result.index, shown, log_key, witnesses
                )
        return result, seal.sealed_at
    finally:
        if http is not None:
            http.close()


def print_verdict(result: ProofCheck, sealed_at: str | None) -> None:
    if not result.ok:
        for error in result.errors:
            output.err.print(f"not verified: {error}", markup=False)
        return
    leaf = result.leaf or {}
    output.out.print(
        f"verified: job {leaf.get('job_id')} (seal over {leaf.get('event_count')} events) "
        f"is leaf {result.index} of {result.origin} at size {result.tree_size}"
        + (f", cosigned by {', '.join(result.witnesses)}" if result.witnesses else ""),
        markup=False,
    )
    first = {True: "yes", False: "no", None: "not proven"}[result.first_for_job]
    output.out.print(f"first leaf for the job: {first} ({result.first_checked})", markup=False)
    cosigned = result.earliest_cosigned
    if cosigned is not None:
        output.out.print(
            f"earliest cosigned: {cosigned.iso()} by {cosigned.witness} (checkpoint of size "
            f"{cosigned.tree_size}): the seal existed by then",
            markup=False,
        )
    else:
        output.out.print("earliest cosigned: none verified (give --witness-key)", markup=False)
    if sealed_at is not None:
        output.out.print(f"sealed_at (the seal's own claim): {sealed_at}", markup=False)

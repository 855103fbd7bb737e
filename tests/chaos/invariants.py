"""The one invariant checker every chaos scenario and the soak run after a job settles.

DESIGN.md "Invariants": every accepted job ends ``completed`` or in an explained terminal state;
exactly one ``result_location`` (and one PNG under ``renders/<job>/``); its bytes equal the
uninterrupted reference render; no tile committed twice; no lease left after its TTL; the audit
trail explains every retry and takeover. :func:`check_job` gathers every violation (the soak
counts them) and the numbers the scenario tables print; :meth:`JobReport.assert_ok` fails a test.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import NoKeysError

from proto import names as n
from shared.metadata import Attempt, AuditEvent
from tests.chaos.rig import Rig
from tests.e2e.conftest import reference_png
from tests.helpers import eventually

#: attempt outcomes that need no error code (a deliberate hand-back, a cancel, the success)
_SELF_EXPLAINED = frozenset({"done", "handed_back", "cancelled"})
_FAILED = frozenset({"failed_retryable", "failed_terminal", "dead_lettered"})


@dataclass
class JobReport:
    """What one job went through, and every invariant it broke."""

    job_id: str
    state: str
    tiles: int = 0
    attempts: int = 0
    resumes: int = 0  # tile attempts that started from a checkpoint (resumed_from > 0)
    takeovers: int = 0  # tile attempts after the first on the same tile
    retries: int = 0  # attempts that ended retryable
    abandoned: int = 0  # attempts whose process died, closed or superseded by a takeover
    dlq: int = 0
    violations: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.violations.append(what)

    def assert_ok(self) -> JobReport:
        assert not self.violations, f"job {self.job_id}: " + "; ".join(self.violations)
        return self


async def check_job(
    rig: Rig,
    job_id: str,
    body: dict[str, Any] | None,
    *,
    expect: str = "completed",
    reason: str | None = None,
    reference: bytes | None = None,
) -> JobReport:
    """Check every invariant of one settled job (``body``: its request, for the reference)."""
    job = await rig.db.get_job(job_id)
    if job is None:
        return JobReport(job_id, "missing", violations=["job row missing"])
    report = JobReport(job_id, job.state.value)
    if job.state.value != expect:
        report.fail(f"state {job.state.value} ({job.last_error_code}: {job.last_error}), "
                    f"expected {expect}")  # fmt: skip
    if expect != "completed":
        if not job.last_error_code or not job.last_error:
            report.fail("terminal state without last_error_code/last_error")
        elif reason is not None and job.last_error_code != reason:
            report.fail(f"last_error_code {job.last_error_code}, expected {reason}")
    await _check_result(rig, report, job, body, reference)
    events = await rig.db.job_events(job_id)
    attempts = await rig.db.attempts(job_id)
    tiles = await rig.db.list_tiles(job_id)
    report.tiles = len(tiles)
    _check_commits(report, events, attempts, len(tiles), completed=expect == "completed")
    _check_explained(report, events, attempts)
    report.dlq = await _dlq_count(rig, job_id)
    await _check_leases(rig, report)
    return report


async def _check_result(
    rig: Rig, report: JobReport, job: Any, body: dict[str, Any] | None, reference: bytes | None
) -> None:
    pngs = [o.key for o in await rig.objects.list(f"renders/{job.job_id}/")]
    pngs = [k for k in pngs if k.endswith(".png")]
    if job.state.value != "completed":
        if job.result_location is not None or pngs:
            report.fail(f"not completed but has a result: {job.result_location} {pngs}")
        return
    if job.result_location is None or job.result_sha256 is None:
        report.fail("completed without result_location/result_sha256")
        return
    if pngs != [job.result_location]:
        report.fail(f"PNGs under renders/{job.job_id}/: {pngs}, result {job.result_location}")
    png = await rig.objects.get(job.result_location, sha256=job.result_sha256)
    if body is not None or reference is not None:
        expected = reference if reference is not None else reference_png(body or {})
        if png != expected:
            report.fail("published PNG differs from the uninterrupted reference render")


def _check_commits(
    report: JobReport,
    events: list[AuditEvent],
    attempts: list[Attempt],
    tiles: int,
    *,
    completed: bool,
) -> None:
    commits = Counter(
        e.tile_index for e in events if e.tile_index is not None and e.to_state == "done"
    )
    done = Counter(
        a.tile_index for a in attempts if a.tile_index is not None and a.outcome == "done"
    )
    twice = sorted({i for i, c in commits.items() if c > 1} | {i for i, c in done.items() if c > 1})
    if twice:
        report.fail(f"tiles committed more than once: {twice}")
    if completed and (len(commits) != tiles or len(done) != tiles):
        report.fail(f"{len(commits)} commits / {len(done)} done attempts for {tiles} tiles")
    completions = sum(1 for e in events if e.entity == "job" and e.to_state == "completed")
    if completions != int(completed):
        report.fail(f"{completions} job completions in the audit trail")


def _check_explained(report: JobReport, events: list[AuditEvent], attempts: list[Attempt]) -> None:
    """Every attempt names its node; every one that did not succeed says why: by its own
    outcome and error code, or — its process died — in the takeover's audit row (``lease``
    event with code ``lease_expired`` naming it), or its unit then failed for good."""
    takeovers = [
        e for e in events if e.trigger == "lease" and e.error_code == "lease_expired" and e.error
    ]
    report.attempts = sum(1 for a in attempts if a.kind == "tile")
    report.resumes = sum(1 for a in attempts if a.kind == "tile" and a.resumed_from > 0)
    report.retries = sum(1 for a in attempts if a.outcome == "retryable")
    by_unit: dict[int | None, list[Attempt]] = {}
    for a in attempts:
        by_unit.setdefault(a.tile_index, []).append(a)
        if not a.attempt_id or not a.node or (a.kind == "tile" and a.fence <= 0):
            report.fail(f"attempt without id, node or fence: {a}")
    for unit, group in by_unit.items():
        if unit is not None:
            report.takeovers += len(group) - 1
        top = max(a.fence for a in group)
        for a in group:
            _check_attempt_explained(report, a, unit=unit, top=top, takeovers=takeovers)
    _check_events_explained(report, events)


def _check_attempt_explained(
    report: JobReport, a: Attempt, *, unit: int | None, top: int, takeovers: list[AuditEvent]
) -> None:
    """One attempt of a unit whose newest fence is ``top``: it ended with a code, or it was
    abandoned and is explained (a takeover's audit row names it, or it was the unit's last
    owner and the job did not complete)."""
    if a.outcome is not None:
        if a.outcome.value not in _SELF_EXPLAINED and not a.error_code:
            report.fail(f"attempt {a.attempt_id} ended {a.outcome.value} without a code")
        return
    report.abandoned += 1
    named = any(a.attempt_id in (e.error or "") for e in takeovers)
    if unit is not None and a.fence < top and not named:
        report.fail(f"takeover of attempt {a.attempt_id} ({a.node}) is not in the trail")
    elif a.fence == top and report.state == "completed":
        report.fail(f"attempt {a.attempt_id} on {a.node} never ended")


def _check_events_explained(report: JobReport, events: list[AuditEvent]) -> None:
    """Every failure in the audit trail carries its error; every tile lease names its owner."""
    for e in events:
        if e.to_state in _FAILED and not (e.error_code and e.error):
            report.fail(f"{e.entity} {e.tile_index} -> {e.to_state} without an error: {e}")
        if e.entity == "tile" and e.trigger == "lease" and not (e.attempt_id and e.node):
            report.fail(f"lease of tile {e.tile_index} without attempt id or node")


async def _dlq_count(rig: Rig, job_id: str) -> int:
    js = rig.nc.jetstream()
    stream = rig.names.stream(n.STREAM_DLQ)
    subjects = rig.names.dlq_subject(job_id, n.DLQ_UNIT_JOB).rsplit(".", 1)[0] + ".*"
    info = await js.stream_info(stream, subjects_filter=subjects)
    return sum((info.state.subjects or {}).values())


async def _check_leases(rig: Rig, report: JobReport) -> None:
    """No lease of the job outlives its TTL (+2 s for the server's expiry sweep)."""
    kv = await rig.nc.jetstream().key_value(rig.names.bucket(n.BUCKET_LEASES))
    left: list[str] = []

    async def none_left() -> bool:
        try:
            left[:] = [k for k in await kv.keys() if report.job_id in k]
        except NoKeysError:
            left.clear()
        return not left

    timeout = rig.settings.leases.ttl + 2
    try:
        await eventually(none_left, timeout=timeout, interval=0.2, what="the job's leases expire")
    except AssertionError:  # a finding of the report, not a failure of the wait
        report.fail(f"leases left after TTL + 2 s: {left}")


def summary_row(
    scenario: str, reports: list[JobReport], rig: Rig, seconds: float, *, kills: int = 0
) -> dict[str, Any]:
    """One row of the scenario table: outcome and counts over the scenario's jobs."""
    from tests.chaos.rig import DUPLICATE_MESSAGES

    return {
        "scenario": scenario,
        "outcome": ",".join(sorted({r.state for r in reports})),
        "kills": kills + rig.supervisor.sigkills,
        "resumes": sum(r.resumes for r in reports),
        "takeovers": sum(r.takeovers for r in reports),
        "dups": rig.count_logged(*DUPLICATE_MESSAGES),
        "dlq": sum(r.dlq for r in reports),
        "violations": sum(len(r.violations) for r in reports),
        "seconds": f"{seconds:.1f}",
    }

"""Least-privilege NATS users, generated from :mod:`proto.names` so they never drift.

One user per service and one for clients. Each may publish and subscribe to exactly what its
code uses; everything else is refused by the server (a refusal looks like a timeout to the
caller and is reported through ``error_cb``, which :func:`shared.nats.jetstream.connect_nats` logs
as ``PERMISSIONS VIOLATION``). All users live in the default account (``$G``).

=============  ===============================================================================
user           may
=============  ===============================================================================
gateway        serve ``tessera.api.>`` in its queue group and reply (``allow_responses``);
               publish JOBS messages and job-cancelled/-retried/-paused/-resumed events; read
               and purge DLQ, publish requeued TILES messages and delete requeued letters; read
               live workers (``status`` says when none runs a renderer; ``workers``), progress
               pointers (``job.preview``) and the oldest pending message of each consumed
               stream (``farm``)
scheduler      consume JOBS and ADVISORIES; publish TILES, DLQ copies, job-dead-lettered and
               job-failed (deadlines);
               read/delete messages of JOBS/TILES (exhausted deliveries, sweeper); read leases
               and live workers; hear ``tessera.room``, tile-done and job-control events
               (resumed, paused, cancelled, failed, dead-lettered, retried: the dispatcher's
               nudges);
               **create and update the topology** (the topology owner, see below)
worker         consume TILES; read/write tile leases, progress pointers and its live-worker
               key (``worker.>``); publish tile-done,
               job-failed/-dead-lettered events, ``tessera.room`` and DLQ copies; hear
               job-cancelled, -paused,
               -failed and -dead-lettered events
finalizer      consume EVENTS tile-done; read/write ``final.<job>`` leases; publish
               job-completed/-failed events and DLQ copies
web            call the API verbs the web console uses (each named: a new verb is not granted
               until listed in :data:`WEB_VERBS`) and hear ``tessera.events.>``; nothing else
               (no JetStream API, no KV, no topology)
client         call ``tessera.api.>`` (request-reply) and watch ``tessera.events.>``
=============  ===============================================================================

Every service runs ``ensure_topology`` at start-up (:mod:`shared.nats.ensure`), which reads each
stream and consumer first and writes only what is missing or different. With
``topology_owner="scheduler"`` (the default) only the scheduler may create or update streams and
consumers; the others get ``STREAM.INFO``/``CONSUMER.INFO`` and start once the scheduler has
declared the topology. ``topology_owner=None`` lets every service create and update (the
original "every service declares" model, at the price of letting a worker reconfigure streams).
No user may delete a stream or consumer. KV reads are leader reads
(``$JS.API.STREAM.MSG.GET.KV_<bucket>``; the buckets have ``allow_direct=False``), so no
``DIRECT.GET`` is granted. Replies come to ``_INBOX.>`` (nats-py's default inbox prefix).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from proto import names as n
from proto.limits import NATS_MAX_PAYLOAD, NATS_MAX_PENDING
from proto.topology import Topology

__all__ = [
    "ROLES",
    "SERVICE_ROLES",
    "EnvRef",
    "Permissions",
    "generate_passwords",
    "permissions",
    "render_config",
    "render_limits",
    "url_for",
]

SERVICE_ROLES = ("gateway", "scheduler", "worker", "finalizer")
#: streams with a durable consumer, whose oldest pending message ``farm`` reads
_STATS_STREAMS = (n.STREAM_JOBS, n.STREAM_TILES, n.STREAM_EVENTS, n.STREAM_ADVISORIES)
ROLES = (*SERVICE_ROLES, "web", "client")
WEB_VERBS = (
    "submit", "status", "list", "cancel", "retry", "result", "dlq.list", "dlq.show",
    "dlq.requeue", "dlq.purge", "priority", "pause", "resume", "project.set", "project.list",
    "project.show", "asset.missing", "asset.chunk", "asset.manifest", "job.tiles",
    "job.timeline", "job.preview", "workers", "farm",
)  # fmt: skip
"""The API verbs the ``web`` user may call: those the HTTP API exposes (services.web.api),
named one by one so a verb added later is not granted by accident."""
INBOX = "_INBOX.>"
API = "$JS.API"


@dataclass(frozen=True)
class Permissions:
    """What one user may publish and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    #: may publish to the reply subject of a request it received (the gateway)
    allow_responses: bool = False


@dataclass(frozen=True)
class EnvRef:
    """A password the server reads from its environment (``password: $NAME``)."""

    name: str


def _dedup(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _consume(stream: str, consumer: str) -> list[str]:
    """Pull from a durable consumer and settle its messages (ack, nak, term, +WPI)."""
    return [f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", f"$JS.ACK.{stream}.{consumer}.>"]


def _kv(bucket: str, keys: str) -> list[str]:
    """Leader reads of a bucket and conditional writes to ``keys`` (a subject wildcard)."""
    return [f"{API}.STREAM.MSG.GET.KV_{bucket}", f"$KV.{bucket}.{keys}"]


def _topology(topology: Topology, *, owner: bool) -> list[str]:
    """``INFO`` on every stream and consumer; create/update too for the topology owner."""
    out: list[str] = []
    for stream in topology.streams():
        out.append(f"{API}.STREAM.INFO.{stream.name}")
        if owner:
            out += [f"{API}.STREAM.CREATE.{stream.name}", f"{API}.STREAM.UPDATE.{stream.name}"]
    if owner:  # the tile messages of the subject form before renderers (shared/nats/ensure.py)
        out.append(f"{API}.STREAM.PURGE.{topology.names.stream(n.STREAM_TILES)}")
    for stream_name, consumer in topology.consumers():
        c = f"{stream_name}.{consumer.name}"
        out.append(f"{API}.CONSUMER.INFO.{c}")
        if owner:  # nats-py puts the filter subject after the name when there is one
            out += [f"{API}.CONSUMER.CREATE.{c}", f"{API}.CONSUMER.CREATE.{c}.>"]
            out.append(f"{API}.CONSUMER.DURABLE.CREATE.{c}")
    return out


def permissions(
    names: n.Names | None = None, *, topology_owner: str | None = "scheduler"
) -> dict[str, Permissions]:
    """The allow lists of every role of the deployment named by ``names``."""
    nm = names or n.Names()
    if topology_owner is not None and topology_owner not in SERVICE_ROLES:
        raise ValueError(f"topology_owner: {topology_owner!r} is not one of {SERVICE_ROLES}")
    topo = Topology(prefix=nm.prefix)
    s = nm.stream
    leases, progress = nm.bucket(n.BUCKET_LEASES), nm.bucket(n.BUCKET_PROGRESS)
    workers = nm.bucket(n.BUCKET_WORKERS)
    ev = nm.event_filter
    dlq = nm.dlq_subjects

    def declares(role: str) -> list[str]:
        return _topology(topo, owner=topology_owner in (None, role))

    pub = {
        "gateway": [
            nm.jobs_subjects,
            ev(n.EventKind.JOB_CANCELLED),
            ev(n.EventKind.JOB_RETRIED),
            ev(n.EventKind.JOB_PAUSED),
            ev(n.EventKind.JOB_RESUMED),
            f"{API}.STREAM.MSG.GET.{s(n.STREAM_DLQ)}",
            f"{API}.STREAM.MSG.GET.KV_{workers}",  # status, workers: the live workers
            # farm: the oldest pending message of each consumer (shared.nats.streams)
            *(f"{API}.STREAM.MSG.GET.{s(b)}" for b in _STATS_STREAMS),
            f"{API}.STREAM.MSG.GET.KV_{progress}",  # job.preview: the tiles' checkpoints
            # dlq requeue: a requeued tile's TILES message, then the letter deleted
            nm.tiles_subjects,
            f"{API}.STREAM.MSG.DELETE.{s(n.STREAM_DLQ)}",
            f"{API}.STREAM.PURGE.{s(n.STREAM_DLQ)}",
        ],
        "scheduler": [
            *_consume(s(n.STREAM_JOBS), n.CONSUMER_SCHEDULER_JOBS),
            *_consume(s(n.STREAM_ADVISORIES), n.CONSUMER_SCHEDULER_ADVISORIES),
            nm.tiles_subjects,
            dlq,
            ev(n.EventKind.JOB_DEAD_LETTERED),
            ev(n.EventKind.JOB_FAILED),  # the deadline check fails overdue jobs
            ev(n.EventKind.TILES_DONE),  # the planner: a retried job whose tiles are all done
            *(f"{API}.STREAM.MSG.GET.{s(b)}" for b in (n.STREAM_JOBS, n.STREAM_TILES)),
            f"{API}.STREAM.MSG.GET.{s(n.STREAM_EVENTS)}",
            *(f"{API}.STREAM.MSG.DELETE.{s(b)}" for b in (n.STREAM_JOBS, n.STREAM_TILES)),
            f"{API}.STREAM.MSG.GET.KV_{leases}",
            f"{API}.STREAM.MSG.GET.KV_{workers}",
        ],
        "worker": [
            *(c for r in n.RENDERERS for c in _consume(s(n.STREAM_TILES), n.workers_consumer(r))),
            *_kv(leases, "tile.>"),
            *_kv(progress, "tile.>"),
            *_kv(workers, "worker.>"),
            ev(n.EventKind.TILE_DONE),
            ev(n.EventKind.TILES_DONE),
            ev(n.EventKind.JOB_FAILED),
            ev(n.EventKind.JOB_DEAD_LETTERED),
            nm.room_subject,  # the dispatchers' nudge: tiles left the hand
            dlq,
        ],
        "finalizer": [
            *_consume(s(n.STREAM_EVENTS), n.CONSUMER_FINALIZER),
            *_kv(leases, "final.>"),
            ev(n.EventKind.JOB_COMPLETED),
            ev(n.EventKind.JOB_FAILED),
            dlq,
        ],
    }
    out = {
        role: Permissions(
            publish=_dedup([*declares(role), *pub[role]]),
            subscribe=_dedup(
                [INBOX, *_service_subscriptions(nm).get(role, [])],
            ),
            allow_responses=role == "gateway",
        )
        for role in SERVICE_ROLES
    }
    out["web"] = Permissions(
        publish=tuple(nm.api_subject(n.ApiVerb(v)) for v in WEB_VERBS),
        subscribe=(INBOX, nm.events_subjects),
    )
    out["client"] = Permissions(publish=(nm.api_subjects,), subscribe=(INBOX, nm.events_subjects))
    return out


def _service_subscriptions(nm: n.Names) -> dict[str, list[str]]:
    return {
        # a queue permission: the gateway can serve the API, not eavesdrop on it
        "gateway": [f"{nm.api_subjects} {nm.queue_group}"],
        # a cancel, and the events after which a worker reads a job's row at once
        "worker": [
            nm.event_filter(n.EventKind.JOB_CANCELLED),
            nm.event_filter(n.EventKind.JOB_PAUSED),
            nm.event_filter(n.EventKind.JOB_FAILED),
            nm.event_filter(n.EventKind.JOB_DEAD_LETTERED),
        ],
        # the dispatcher's nudges: tiles left a worker's hand (Room; the tile-done events of
        # workers from before it), a job resumed, paused, cancelled, failed, dead-lettered or
        # retried
        "scheduler": [
            nm.room_subject,
            nm.tile_done_filter,
            *(nm.event_filter(k) for k in n.DISPATCH_NUDGES),
        ],
        # the read-ahead: each tile-done event to one finalizer of the group
        "finalizer": [f"{nm.tile_done_filter} {nm.read_ahead_group}"],
    }


def generate_passwords() -> dict[str, str]:
    """A fresh random password per role (URL-safe, so it fits in ``nats://user:pass@host``)."""
    return {role: secrets.token_urlsafe(24) for role in ROLES}


def render_limits(max_payload: int = NATS_MAX_PAYLOAD, max_pending: int = NATS_MAX_PENDING) -> str:
    """The server limits every Tessera NATS configuration starts with (see proto/limits.py)."""
    return (
        "# max_payload: proto.limits.NATS_MAX_PAYLOAD (the largest request plus its headers)\n"
        f"max_payload: {max_payload}\n"
        "# max_pending: proto.limits.NATS_MAX_PENDING (buffered for a lagging connection)\n"
        f"max_pending: {max_pending}\n"
    )


def render_config(
    passwords: Mapping[str, str | EnvRef],
    names: n.Names | None = None,
    *,
    topology_owner: str | None = "scheduler",
    user_prefix: str = "",
) -> str:
    """A nats-server config (``-c FILE``): :func:`render_limits`, then ``authorization { ... }``.

    ``passwords`` maps every role to its password, or to an :class:`EnvRef` the server resolves
    from its environment. Users are named ``<user_prefix><role>``.
    """
    perms = permissions(names, topology_owner=topology_owner)
    missing = set(ROLES) - set(passwords)
    if missing:
        raise ValueError(f"no password for {sorted(missing)}")
    users = [_user(user_prefix + role, passwords[role], perms[role]) for role in ROLES]
    head = (
        "# Generated by shared/devstack/natsauth.py from proto/names.py; regenerate, do not edit.\n"
    )
    return (
        head + render_limits() + "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"
    )


def _user(user: str, password: str | EnvRef, perms: Permissions) -> str:
    secret = f"${password.name}" if isinstance(password, EnvRef) else json.dumps(password)
    lines = [
        "    {",
        f"      user: {json.dumps(user)}",
        f"      password: {secret}",
        "      permissions: {",
        f"        publish: {{ allow: {_list(perms.publish)} }}",
        f"        subscribe: {{ allow: {_list(perms.subscribe)} }}",
    ]
    if perms.allow_responses:
        lines.append("        allow_responses: true")
    return "\n".join([*lines, "      }", "    }"])


def _list(subjects: tuple[str, ...]) -> str:
    inner = ",\n".join(f"          {json.dumps(s)}" for s in subjects)
    return f"[\n{inner}\n        ]"


def url_for(url: str, user: str, password: str) -> str:
    """``url`` (one or several, comma-separated) with ``user:password@`` in each."""
    out = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        host = parts.netloc.rsplit("@", 1)[-1]
        out.append(urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}")))
    return ",".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the config with passwords read from ``TESSERA_NATS_PASSWORD_<ROLE>`` at run time."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m shared.devstack.natsauth", description=__doc__)
    parser.add_argument("--namespace", default="", help="TESSERA_NAMESPACE of the deployment")
    parser.add_argument("--owner", default="scheduler", help="topology owner, or 'all'")
    args = parser.parse_args(argv)
    refs = {role: EnvRef(f"TESSERA_NATS_PASSWORD_{role.upper()}") for role in ROLES}
    owner = None if args.owner == "all" else args.owner
    names = n.Names(args.namespace)
    print(render_config(refs, names, topology_owner=owner), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

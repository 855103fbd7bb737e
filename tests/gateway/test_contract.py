"""Drift between the gateway and proto's reply schemas is caught on the wire.

Every verb is called for real; each reply must carry exactly the fields of its schema (and each
nested object those of its item schema): no more, none missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from typing import Any

import msgpack
import orjson
from nats.aio.client import Client as NATS

from proto.api import SubmitRequest
from proto.api_replies import VERB_REPLIES, field_docs, reply_fields
from proto.names import BUCKET_WORKERS, ApiVerb, Names, new_job_id
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from shared.core.lifecycle import JobTrigger
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.service.runtime import Runtime
from tests.gateway.conftest import body
from tests.gateway.results import completed_job
from tests.gateway.test_dlq import _dead_letter


def assert_shape(schema: type, value: Any, where: str) -> None:
    """``value`` (parsed JSON) has exactly ``schema``'s fields, recursively."""
    assert isinstance(value, dict), where
    assert list(value) == list(reply_fields(schema)), f"{where}: fields differ from {schema}"
    for name, (tp, _) in field_docs(schema).items():
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
        if not dataclasses.is_dataclass(inner):
            continue
        items = value[name] if typing.get_origin(tp) is list else [value[name]]
        assert items, f"{where}.{name}: call it so that it lists something"
        for i, item in enumerate(items):
            assert_shape(typing.cast(type, inner), item, f"{where}.{name}[{i}]")


def test_each_handler_declares_its_verb_s_reply_schema(gateway: Gateway) -> None:
    verbs = gateway._verbs()
    assert set(verbs) == set(ApiVerb)
    for verb, handler in verbs.items():
        assert typing.get_type_hints(handler)["return"] is VERB_REPLIES[verb], verb


async def test_every_verb_s_reply_has_exactly_its_schema_s_fields(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names
) -> None:
    job_id = await completed_job(runtime, client, b"png bytes", b"npy bytes", seed=1)
    cancel_me = (await client.submit(SubmitRequest(**body(seed=2))))["job_id"]
    failed = (await client.submit(SubmitRequest(**body(seed=3))))["job_id"]
    pause_me = (await client.submit(SubmitRequest(**body(seed=4))))["job_id"]
    await runtime.db.transition_job(failed, JobTrigger.TERMINAL_FAILURE, error_code="invalid")
    letter_job = new_job_id()
    await _dead_letter(runtime, letter_job, 0, source_seq=1)
    await runtime.js.publish(runtime.names.dlq_subject(letter_job, "job"), b"not msgpack")
    workers = LiveWorkers(runtime.js, runtime.names.bucket(BUCKET_WORKERS))
    await workers.put(WorkerInfo("w1", 2, 1, {"tessera": "1"}, "0.9", 1.0, [[job_id, 0]]))
    scene = b"sphere { 0, 1 }"
    digest = hashlib.sha256(scene).hexdigest()
    file = {"path": "a.pov", "size": len(scene), "sha256": digest, "chunks": [digest]}
    manifest = {"main": "a.pov", "files": [file]}
    bodies: dict[ApiVerb, dict[str, Any]] = {
        ApiVerb.SUBMIT: body(seed=1),
        ApiVerb.STATUS: {"job_id": job_id},
        ApiVerb.LIST: {},
        ApiVerb.CANCEL: {"job_id": cancel_me},
        ApiVerb.RETRY: {"job_id": failed},
        ApiVerb.RESULT: {"job_id": job_id},
        ApiVerb.DLQ_LIST: {},  # a dead letter and a malformed message
        ApiVerb.DLQ_SHOW: {"seq": 1},
        ApiVerb.DLQ_REQUEUE: {"dry_run": True},
        ApiVerb.DLQ_PURGE: {"all": True, "dry_run": True},
        ApiVerb.PRIORITY: {"job_id": pause_me, "priority": 70},
        ApiVerb.PAUSE: {"job_id": pause_me},
        ApiVerb.RESUME: {"job_id": pause_me},
        ApiVerb.PROJECT_SET: {"name": "gw", "weight": 2, "max_in_flight": 3, "actor": "t"},
        ApiVerb.PROJECT_LIST: {},  # "gw" has jobs and settings
        ApiVerb.PROJECT_SHOW: {"name": "gw"},
        ApiVerb.ASSET_MISSING: {"chunks": [digest]},
        ApiVerb.ASSET_CHUNK: {"sha256": digest, "data": scene},
        ApiVerb.ASSET_MANIFEST: {"manifest": manifest, "renderer": "povray"},
        ApiVerb.JOB_TILES: {"job_id": job_id},
        ApiVerb.JOB_TIMELINE: {"job_id": job_id},
        ApiVerb.JOB_PREVIEW: {"job_id": job_id, "max_edge": 32},
        ApiVerb.WORKERS: {},  # one live worker
        ApiVerb.FARM: {"window": 60},
    }
    assert set(bodies) == set(ApiVerb)
    for verb, request in bodies.items():
        if verb is ApiVerb.ASSET_CHUNK:  # binary data: msgpack only
            data, headers = msgpack.packb(request), {"Content-Type": "application/msgpack"}
        else:
            data, headers = orjson.dumps(request), None
        msg = await nc.request(names.api_subject(verb), data, timeout=10, headers=headers)
        reply = orjson.loads(msg.data)
        assert reply.pop("ok") is True, (verb, reply)
        assert_shape(VERB_REPLIES[verb], reply, verb.value)
    chunk = await client.result(job_id, inline=True)
    assert_shape(VERB_REPLIES[ApiVerb.RESULT], chunk, "result")

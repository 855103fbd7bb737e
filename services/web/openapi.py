"""The OpenAPI 3.1 document of the HTTP API, generated from the route table of :mod:`.api`.

Request and reply bodies are the gateway's (``proto.api`` requests, ``proto.api_replies``
replies): their JSON Schemas are derived from those dataclasses and their ``Annotated`` texts,
the same walk ``proto/apidoc.py`` makes for ``docs/api.md``, so the document cannot drift from
what the gateway answers. A verb whose dataclasses this build lacks gets the schema
:data:`FALLBACK_REPLIES` gives (the fields the contract fixes, more allowed).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from proto.api_replies import field_docs
from shared.core.lifecycle import JobState

if TYPE_CHECKING:
    from services.web.api import Route

__all__ = ["ERROR_SCHEMA", "FALLBACK_REPLIES", "SchemaSet", "document"]

_NULL = {"type": "null"}
_STR, _INT, _NUM, _BOOL = (
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
)


def _opt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _NULL]}


def _obj(props: dict[str, dict[str, Any]], doc: str) -> dict[str, Any]:
    return {"type": "object", "description": doc, "required": list(props), "properties": props}


_TILE = _obj(
    {
        "index": _INT, "x": _INT, "y": _INT, "w": _INT, "h": _INT, "state": _STR,
        "samples_done": _INT, "spp": _INT, "attempts": _INT, "takeovers": _INT,
        "resumes": _INT, "last_error_code": _opt(_STR), "last_error": _opt(_STR),
        "node": _opt(_STR),
    },
    "one tile (index order): its state, samples, and counts from the audit trail",
)  # fmt: skip
_EVENT = _obj(
    {
        "id": _INT, "at": _STR, "kind": _STR, "tile_index": _opt(_INT),
        "attempt_id": _opt(_STR), "node": _opt(_STR), "detail": _opt(_STR),
        "error_code": _opt(_STR),
    },
    "one row of the job's audit trail",
)  # fmt: skip
_WORKER = _obj(
    {
        "node": _STR, "threads": _INT, "in_hand": _INT,
        "renderers": {"type": "object", "additionalProperties": _STR}, "version": _STR,
        "started_at": _opt(_STR), "current_tiles": {"type": "array"},
    },
    "one live worker",
)  # fmt: skip
_FARM_NUMBERS = ("queue_depth", "oldest_age_s", "in_flight", "retry_rate",
                 "duplicates_suppressed", "lease_renewal_failures", "resume_rate",
                 "latency_p50_s", "latency_p95_s", "latency_p99_s", "dlq_size",
                 "finalization_failures", "window_s")  # fmt: skip

FALLBACK_REPLIES: dict[str, dict[str, Any]] = {
    "job.tiles": _obj(
        {
            "job_id": _STR, "width": _INT, "height": _INT, "tile_size": _INT,
            "renderer": _STR, "state": _STR, "tiles": {"type": "array", "items": _TILE},
        },
        "``job.tiles``: every tile of a job",
    ),
    "job.timeline": _obj(
        {
            "job_id": _STR, "events": {"type": "array", "items": _EVENT},
            "next_before_id": _opt(_INT),
        },
        "``job.timeline``: the job's audit trail, newest first",
    ),
    "workers": _obj(
        {"workers": {"type": "array", "items": _WORKER}}, "``workers``: the live workers"
    ),
    "farm": _obj(
        {**{k: _opt(_NUM) for k in _FARM_NUMBERS}, "at": _STR},
        "``farm``: the farm's operational numbers over the window",
    ),
}  # fmt: skip
"""Reply schemas of the console verbs, for a build whose ``proto`` lacks their dataclasses."""

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "the gateway's error code (bad_request, invalid, not_found, "
                    "conflict, illegal_state, busy, unavailable, internal) or unauthorized, "
                    "forbidden, too_large, method_not_allowed",
                },
                "message": {"type": "string", "description": "for humans; never parse it"},
                "retry_after": {"type": "number", "description": "busy: seconds to wait"},
            },
        }
    },
}


class SchemaSet:
    """JSON Schemas of dataclasses, each once under ``components/schemas``."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {"Error": ERROR_SCHEMA}

    def of(self, tp: Any) -> dict[str, Any]:
        """The schema of a Python annotation (a dataclass becomes a ``$ref``)."""
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
            return {"anyOf": [self.of(a) for a in typing.get_args(tp)]}
        origin = typing.get_origin(tp)
        if origin is Literal:
            return {"enum": list(typing.get_args(tp))}
        if origin is list:
            return {"type": "array", "items": self.of(typing.get_args(tp)[0])}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.of(typing.get_args(tp)[1])}
        if inspect.isclass(tp) and dataclasses.is_dataclass(tp):
            return self.ref(tp)
        if inspect.isclass(tp) and issubclass(tp, Enum):
            values = [m.value for m in tp]
            doc = "a job state" if tp is JobState else tp.__name__
            return {"type": "string", "enum": values, "description": doc}
        simple = {str: _STR, int: _INT, float: _NUM, bool: _BOOL, type(None): _NULL}
        if tp in simple:
            return dict(simple[tp])
        if tp is bytes:
            return {"type": "string", "contentEncoding": "base64"}
        if tp is Any:
            return {}
        raise TypeError(f"no JSON Schema for {tp!r}")

    def ref(self, cls: type) -> dict[str, Any]:
        """``{"$ref": ...}`` to ``cls``'s schema, registered on first use."""
        name = cls.__name__
        if name not in self.components:
            self.components[name] = {}  # recursion guard
            self.components[name] = self.object(cls)
        return {"$ref": f"#/components/schemas/{name}"}

    def object(
        self, cls: type, *, omit: tuple[str, ...] = (), strict: bool = False
    ) -> dict[str, Any]:
        """The object schema of a dataclass; ``omit`` leaves fields out (they come from the
        path), ``strict`` refuses unknown fields (a request: the gateway refuses them too)."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        props: dict[str, dict[str, Any]] = {}
        required: list[str] = []
        for name, (tp, text) in field_docs(cls).items():
            if name in omit:
                continue
            schema = self.of(tp)
            schema = {**schema, "description": text} if "$ref" not in schema else schema
            if defaults[name] is dataclasses.MISSING:
                required.append(name)
            elif defaults[name] is None and type(None) not in typing.get_args(tp):
                schema = _opt(schema)
            props[name] = schema
        out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        out["description"] = inspect.cleandoc(cls.__doc__ or cls.__name__).split("\n\n")[0]
        if strict:
            out["additionalProperties"] = False
        return out


def document(routes: list[Route], *, title: str, version: str) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document of ``routes``."""
    schemas = SchemaSet()
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = route.operation(schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "Tessera's HTTP API: the gateway's verbs over HTTP (bodies are the "
            "gateway's replies without ``ok``), live events as server-sent events. Token "
            "roles: viewer (GET) and operator (everything); see docs/web.md.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"session": []}],
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "tessera_session",
                    "description": "the login form's cookie; state-changing requests must also "
                    "send the tessera_csrf cookie's value in X-CSRF-Token",
                },
            },
        },
    }

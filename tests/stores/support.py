"""Helpers shared by the store adapter tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from shared.config import ObjectStoreSettings, Settings
from tests.helpers import eventually

T = TypeVar("T")


def nats_settings(url: str, tmp_path: Path) -> Settings:
    """Settings that only name a NATS server (the other stores are unused placeholders)."""
    return Settings(
        nats_urls=(url,),
        database_url="postgresql://unused@127.0.0.1:1/unused",
        object_store=ObjectStoreSettings(kind="file", path=str(tmp_path)),
    )


async def wait_for_async(check: Callable[[], Awaitable[T]], *, timeout: float, what: str) -> T:
    """:func:`tests.helpers.eventually` for an async predicate, typed for mypy.

    (``eventually``'s ``T | Awaitable[T]`` parameter makes mypy infer ``Never`` for coroutines.)
    """
    return cast(T, await eventually(cast(Any, check), timeout=timeout, what=what))

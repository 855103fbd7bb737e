"""Helpers shared by the store adapter tests."""

from __future__ import annotations

from pathlib import Path

from shared.core.config import ObjectStoreSettings, Settings


def nats_settings(url: str, tmp_path: Path) -> Settings:
    """Settings that only name a NATS server (the other stores are unused placeholders)."""
    return Settings(
        nats_urls=(url,),
        database_url="postgresql://unused@127.0.0.1:1/unused",
        object_store=ObjectStoreSettings(kind="file", path=str(tmp_path)),
    )

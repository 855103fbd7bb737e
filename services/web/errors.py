"""The web service's error answer: ``{"error": {"code", "message"}}`` with an HTTP status."""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["WebError"]


class WebError(Exception):
    """An error answer: status, code, message (and a Retry-After)."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after

    def response(self) -> web.Response:
        """The JSON error answer."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        headers = {}
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        return web.json_response({"error": error}, status=self.status, headers=headers)

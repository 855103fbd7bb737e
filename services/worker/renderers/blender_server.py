"""Tessera's render server, run by Blender's own Python: one request per stdin line.

Started as ``blender -b --factory-startup --python blender_server.py`` by
:mod:`services.worker.renderers.blender`. It keeps the last ``.blend`` open, so passes and
tiles of the same file skip the load, and answers each request with one line on its original
stdout, prefixed by :data:`MARK`; everything Blender itself prints is moved to stderr, so the
reply channel carries nothing else. It imports only ``bpy`` and the standard library.

Requests (JSON, one per line)::

    {"op": "hello"}
    {"op": "render", "file": path, "frame": int, "width": int, "height": int,
     "rect": [x0, y0, x1, y1] | null, "start": int, "end": int, "threads": int,
     "seed": int | null, "out": path}

Replies: ``{"ok": true, ...}``, ``{"event": "started"}`` just before a render begins, or
``{"ok": false, "kind": "scene" | "request" | "render", "message": str}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import bpy

MARK = "\x1etessera-blender "


def _border(scene: Any, req: dict[str, Any]) -> None:
    render = scene.render
    rect = req.get("rect")
    if rect is None:
        render.use_border = False
        return
    x0, y0, x1, y1 = rect
    w, h = req["width"], req["height"]
    render.use_border = True
    render.use_crop_to_border = True
    # Blender truncates border * size to whole pixels: half a pixel in keeps every edge exact.
    # Its y axis points up, ours down.
    render.border_min_x = min(1.0, (x0 + 0.5) / w)
    render.border_max_x = min(1.0, (x1 + 0.5) / w)
    render.border_min_y = min(1.0, (h - y1 + 0.5) / h)
    render.border_max_y = min(1.0, (h - y0 + 0.5) / h)


def configure(scene: Any, req: dict[str, Any]) -> None:
    """Apply a request's settings: the frame, size, samples [start, end), CPU, no adaptivity."""
    scene.frame_set(req["frame"])
    render = scene.render
    render.engine = "CYCLES"
    render.resolution_x, render.resolution_y = req["width"], req["height"]
    render.resolution_percentage = 100
    render.threads_mode = "FIXED"
    render.threads = req["threads"]
    render.use_persistent_data = False
    cycles = scene.cycles
    cycles.device = "CPU"
    cycles.use_adaptive_sampling = False
    cycles.use_denoising = False
    cycles.time_limit = 0.0
    if req.get("seed") is not None:
        cycles.seed = req["seed"]
    cycles.sample_offset = req["start"]
    cycles.samples = req["end"] - req["start"]
    _border(scene, req)
    settings = render.image_settings
    settings.file_format = "OPEN_EXR"
    settings.color_depth = "32"
    settings.color_mode = "RGBA"
    settings.exr_codec = "ZIP"
    render.use_file_extension = False
    render.filepath = req["out"]


class Server:
    """The open file and the reply channel."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.loaded: str | None = None

    def send(self, obj: dict[str, Any]) -> None:
        self.reply.write(MARK + json.dumps(obj) + "\n")
        self.reply.flush()

    def load(self, path: str) -> None:
        if self.loaded == path:
            return
        self.loaded = None
        bpy.ops.wm.open_mainfile(filepath=path, load_ui=False)
        self.loaded = path

    def render(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            self.load(req["file"])
        except Exception as exc:  # Blender reports a bad file as a RuntimeError
            return {"ok": False, "kind": "scene", "message": str(exc).strip()}
        scene = bpy.context.scene
        if scene.camera is None:
            return {
                "ok": False,
                "kind": "scene",
                "message": f"{req['file']}: the scene has no camera",
            }
        try:
            configure(scene, req)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return {"ok": False, "kind": "request", "message": f"bad request: {exc!r}"}
        self.send({"event": "started"})
        try:
            bpy.ops.render.render(write_still=True, scene=scene.name)
        except Exception as exc:
            return {"ok": False, "kind": "render", "message": str(exc).strip()}
        return {"ok": True, "path": req["out"]}

    def handle(self, line: str) -> dict[str, Any]:
        try:
            req = json.loads(line)
        except ValueError as exc:
            return {"ok": False, "kind": "request", "message": f"not JSON: {exc}"}
        if req.get("op") == "hello":
            return {"ok": True, "version": bpy.app.version_string, "pid": os.getpid()}
        if req.get("op") == "render":
            return self.render(req)
        return {"ok": False, "kind": "request", "message": f"unknown op {req.get('op')!r}"}


def main() -> None:
    """Serve requests until stdin closes."""
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)  # Blender's own output (render progress, warnings) goes to stderr
    server = Server(reply)
    for line in sys.stdin:
        if line.strip():
            server.send(server.handle(line))


if __name__ == "__main__":
    main()

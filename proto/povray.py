"""What a POV-Ray job may ask for: the options and scene features that tile exactly.

Pure checks (the standard library's ``re`` only), shared by the client (refused before any
upload, exit 2), the gateway (refused at ``submit`` and ``asset.manifest`` with ``invalid``)
and the worker (checked again before a render), so all three say the same thing.

Tessera renders a POV-Ray tile as a region grown to whole render blocks and cropped
(:mod:`services.worker.renderers.povray`): with adaptive anti-aliasing (method 1) and no jitter
the tiles equal POV-Ray's own full frame pixel for pixel. Jitter (random per render) and
radiosity (its pre-trace depends on the rendered region) cannot be exact and are refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shared.core.errors import ValidationError

__all__ = ["BLOCK", "MAX_OPTIONS", "check_povray_options", "check_povray_source"]

MAX_OPTIONS = 32
#: POV-Ray's render block (``Render_Block_Size``, 32 by default): anti-aliasing works block by
#: block, and a region's blocks start at the region's corner, so a tile is rendered as the whole
#: blocks of the full frame's grid that cover it, then cropped (auto tile edges are multiples)
BLOCK = 32
"""POV-Ray options one job may carry."""
_ALLOWED = [
    (re.compile(r"[+-]A(\d*\.?\d+)?", re.I), "anti-aliasing on/off and threshold"),
    (re.compile(r"\+R\d+", re.I), "anti-aliasing depth"),
    (re.compile(r"\+AM1", re.I), "anti-aliasing method 1"),
    (re.compile(r"-J", re.I), "jitter off"),
    (re.compile(r"[+-]Q\d", re.I), "quality"),
    (re.compile(r"\+K-?\d*\.?\d+", re.I), "clock"),
    (re.compile(r"(Antialias|Jitter)=(on|off|true|false|yes|no|[01])", re.I), "INI switches"),
    (re.compile(r"(Antialias_Threshold|Antialias_Depth|Quality|Clock)=-?\d*\.?\d+", re.I), "INI"),
    (re.compile(r"Sampling_Method=1", re.I), "anti-aliasing method 1"),
    (re.compile(r"Declare=[A-Za-z_]\w*=-?\d*\.?\d+"), "declared constants"),
]
_JITTER = re.compile(r"\+J|Jitter=(on|true|yes|1)", re.I)
_SOURCE_REFUSED = {
    "jitter": "`jitter` (area lights) is random per render, so tiles could not equal the frame",
    "radiosity": "radiosity's pre-trace depends on the rendered region, so tiles would differ",
}


def check_povray_options(options: Sequence[str]) -> list[str]:
    """The POV-Ray options a job may carry, or ValidationError naming the one refused.

    Size, output, region, threads and display are Tessera's; only options that tile exactly are
    accepted (anti-aliasing method 1 without jitter, quality, clock, declared constants).
    """
    if len(options) > MAX_OPTIONS:
        raise ValidationError(f"POV-Ray options: {len(options)} given, at most {MAX_OPTIONS}")
    for opt in options:
        if not isinstance(opt, str):
            raise ValidationError(f"POV-Ray options: expected strings, got {opt!r:.40}")
        if _JITTER.fullmatch(opt) or opt.upper().startswith("+J"):
            raise ValidationError(
                f"POV-Ray option {opt!r:.60} refused: jitter is random per render, so tiles could"
                " not equal the full frame pixel for pixel; use -J (the default)"
            )
        if not any(pattern.fullmatch(opt) for pattern, _ in _ALLOWED):
            allowed = ", ".join(sorted({what for _, what in _ALLOWED}))
            raise ValidationError(
                f"POV-Ray option {opt!r:.60} refused: Tessera sets size, output, region and "
                f"threads itself, and accepts only options that tile exactly ({allowed})"
            )
    return list(options)


def _strip_comments_and_strings(text: str) -> str:
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', " ", text, flags=re.S)


def check_povray_source(text: str, name: str) -> None:
    """ValidationError if a ``.pov``/``.inc`` source uses a feature that cannot tile exactly.

    A scan of keywords outside comments and strings: it cannot see a keyword built at parse
    time (``Parse_String``), which POV-Ray's own scenes do not do for these two.
    """
    code = _strip_comments_and_strings(text)
    for keyword, why in _SOURCE_REFUSED.items():
        match = re.search(rf"\b{keyword}\b", code)
        if match is not None:
            line = code.count("\n", 0, match.start()) + 1
            raise ValidationError(f"{name} line {line}: {why}")

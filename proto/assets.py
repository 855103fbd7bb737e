"""Scene assets: the manifest, its path rules, and the POV-Ray dependency scanner.

Shared by the client (which builds and checks a manifest before uploading), the gateway (which
checks it again before storing it) and the worker (which trusts only what it verifies itself).

An asset is a set of files with relative paths, one of them the ``main`` scene file. Each file
is cut into chunks of :data:`~proto.limits.ASSET_CHUNK_BYTES` (the last one shorter; an empty
file has none), each stored once under its sha256 (``assets/chunks/<sha256>``). The manifest::

    {"main": "scene.pov",
     "files": [{"path": "scene.pov", "size": 812, "sha256": "…", "chunks": ["…"]}, …]}

is stored as canonical JSON (:func:`proto.canonical.canonical_json`, ``files`` sorted by path)
under its own sha256 (``assets/manifests/<sha256>``): that digest is the asset's reference.

Path rules (:func:`check_asset_path`): ``/``-separated, relative, no empty, ``.`` or ``..`` part,
no backslash, no drive letter, no control character, at most :data:`MAX_ASSET_PATH` characters;
two paths may not be equal ignoring case (they would collide on a case-insensitive disk), nor
may one be a directory of another.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proto.canonical import canonical_json
from proto.fields import as_int
from proto.limits import ASSET_CHUNK_BYTES, MAX_ASSET_FILES, MAX_MANIFEST_BYTES
from shared.core.errors import DecodeError, ValidationError

__all__ = [
    "POV_STANDARD_INCLUDES",
    "AssetFile",
    "Manifest",
    "check_asset_path",
    "chunk_count",
    "chunk_sizes",
    "pov_dependencies",
    "pov_references",
]

MAX_ASSET_PATH = 1024
MAX_PATH_PART = 255
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"[A-Za-z]:")


def check_asset_path(path: Any, what: str = "path") -> str:
    """``path`` if it is a safe relative asset path (see the module docstring), else raise."""
    if not isinstance(path, str):
        raise DecodeError(f"{what}: expected a string, got {type(path).__name__}")
    shown = f"{path!r:.120}"
    if not path or len(path) > MAX_ASSET_PATH:
        raise ValidationError(f"{what}: {shown} must be 1..{MAX_ASSET_PATH} characters")
    if "\\" in path:
        raise ValidationError(f"{what}: {shown} contains a backslash (use / between directories)")
    if _CONTROL.search(path):
        raise ValidationError(f"{what}: {shown} contains a control character")
    if path.startswith("/") or path.startswith("~"):
        raise ValidationError(f"{what}: {shown} is an absolute path (assets hold relative paths)")
    if _DRIVE.match(path):
        raise ValidationError(f"{what}: {shown} starts with a drive letter")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ValidationError(
                f"{what}: {shown} has an empty, '.' or '..' part (no path may leave the asset)"
            )
        if len(part) > MAX_PATH_PART:
            raise ValidationError(f"{what}: {shown} has a part over {MAX_PATH_PART} characters")
    return path


def chunk_count(size: int) -> int:
    """Chunks of a file of ``size`` bytes (0 for an empty file)."""
    return -(-size // ASSET_CHUNK_BYTES)


def chunk_sizes(size: int) -> list[int]:
    """The size of each chunk of a file of ``size`` bytes."""
    n = chunk_count(size)
    return [ASSET_CHUNK_BYTES] * (n - 1) + [size - (n - 1) * ASSET_CHUNK_BYTES] if n else []


@dataclass(frozen=True)
class AssetFile:
    """One file of an asset: where it goes, how big, its digest and its chunks' digests."""

    path: str
    size: int
    sha256: str
    chunks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The manifest entry."""
        chunks = list(self.chunks)
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "chunks": chunks}


def _sha(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"{what}: expected a string, got {type(value).__name__}")
    if _SHA256.fullmatch(value) is None:
        raise ValidationError(f"{what}: {value!r:.80} is not a lowercase hex sha256 digest")
    return value


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: safe unique paths, sizes within the bound, chunk lists that fit."""

    main: str
    files: tuple[AssetFile, ...]

    @property
    def size(self) -> int:
        """Bytes of all files."""
        return sum(f.size for f in self.files)

    def chunks(self) -> list[str]:
        """Every distinct chunk digest, in the order of first use."""
        return list(dict.fromkeys(c for f in self.files for c in f.chunks))

    def file(self, path: str) -> AssetFile | None:
        """The file at ``path``, if the asset has one."""
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> dict[str, Any]:
        """The manifest document."""
        return {"main": self.main, "files": [f.to_json() for f in self.files]}

    def canonical(self) -> bytes:
        """The bytes stored (and hashed for the reference)."""
        return canonical_json(self.to_json())

    @classmethod
    def build(cls, main: str, files: Iterable[AssetFile], *, max_bytes: int) -> Manifest:
        """A manifest of ``files`` (sorted by path), checked (raises like :meth:`parse`)."""
        doc = {"main": main, "files": [f.to_json() for f in files]}
        return cls.parse(doc, max_bytes=max_bytes)

    @classmethod
    def parse(cls, doc: Any, *, max_bytes: int) -> Manifest:
        """Check a manifest document; DecodeError for a wrong shape, ValidationError for a
        value outside the rules (a bad path, a duplicate, sizes over ``max_bytes`` ...)."""
        if not isinstance(doc, Mapping):
            raise DecodeError(f"manifest: expected an object, got {type(doc).__name__}")
        extra = sorted(set(doc) - {"main", "files"})
        if extra:
            raise DecodeError(f"manifest: unknown field(s) {', '.join(map(repr, extra))}")
        main = check_asset_path(doc.get("main"), "manifest.main")
        raw_files = doc.get("files")
        if not isinstance(raw_files, list):
            raise DecodeError("manifest.files: expected an array")
        if not 1 <= len(raw_files) <= MAX_ASSET_FILES:
            raise ValidationError(
                f"manifest.files: {len(raw_files)} files is outside the limit 1..{MAX_ASSET_FILES}"
            )
        files = sorted((_file(i, raw) for i, raw in enumerate(raw_files)), key=lambda f: f.path)
        _check_unique(files)
        total = sum(f.size for f in files)
        if total > max_bytes:
            raise ValidationError(
                f"manifest: the asset's {total} bytes exceed the limit of {max_bytes} bytes"
            )
        manifest = cls(main, tuple(files))
        if manifest.file(main) is None:
            raise ValidationError(f"manifest.main: {main!r:.120} is not one of the files")
        size = len(manifest.canonical())
        if size > MAX_MANIFEST_BYTES:
            raise ValidationError(
                f"manifest: {size} bytes of JSON exceed the limit {MAX_MANIFEST_BYTES}"
            )
        return manifest


def _file(index: int, raw: Any) -> AssetFile:
    where = f"manifest.files[{index}]"
    if not isinstance(raw, Mapping):
        raise DecodeError(f"{where}: expected an object, got {type(raw).__name__}")
    extra = sorted(set(raw) - {"path", "size", "sha256", "chunks"})
    if extra:
        raise DecodeError(f"{where}: unknown field(s) {', '.join(map(repr, extra))}")
    path = check_asset_path(raw.get("path"), f"{where}.path")
    size = as_int(f"{where}.size", raw.get("size"))
    if size < 0:
        raise ValidationError(f"{where}.size: {size} is negative")
    digest = _sha(raw.get("sha256"), f"{where}.sha256")
    chunks = raw.get("chunks")
    if not isinstance(chunks, list):
        raise DecodeError(f"{where}.chunks: expected an array")
    if len(chunks) != chunk_count(size):
        raise ValidationError(
            f"{where}.chunks: {len(chunks)} chunks for {size} bytes; expected "
            f"{chunk_count(size)} of {ASSET_CHUNK_BYTES} bytes (the last one shorter)"
        )
    return AssetFile(
        path, size, digest, tuple(_sha(c, f"{where}.chunks[{i}]") for i, c in enumerate(chunks))
    )


def _check_unique(files: list[AssetFile]) -> None:
    seen: dict[str, str] = {}
    for f in files:
        folded = f.path.casefold()
        if folded in seen:
            same = "twice" if seen[folded] == f.path else f"and as {seen[folded]!r:.120}"
            raise ValidationError(f"manifest: path {f.path!r:.120} appears {same}")
        seen[folded] = f.path
    for folded, path in seen.items():
        parts = folded.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in seen:
                raise ValidationError(
                    f"manifest: {seen[parent]!r:.120} is a file and a directory of {path!r:.120}"
                )


# ----------------------------------------------------------------------------------- POV-Ray

POV_STANDARD_INCLUDES = frozenset(
    [
        "arrays.inc",
        "chars.inc",
        "colors.inc",
        "consts.inc",
        "debug.inc",
        "finish.inc",
        "functions.inc",
        "glass.inc",
        "glass_old.inc",
        "golds.inc",
        "ior.inc",
        "logo.inc",
        "makegrass.inc",
        "math.inc",
        "meshmaker.inc",
        "metals.inc",
        "rad_def.inc",
        "rand.inc",
        "screen.inc",
        "shapes.inc",
        "shapes2.inc",
        "shapes3.inc",
        "shapes_old.inc",
        "shapesq.inc",
        "skies.inc",
        "stage1.inc",
        "stars.inc",
        "stdcam.inc",
        "stdinc.inc",
        "stoneold.inc",
        "stones.inc",
        "stones1.inc",
        "stones2.inc",
        "strings.inc",
        "sunpos.inc",
        "textures.inc",
        "transforms.inc",
        "woodmaps.inc",
        "woods.inc",
        "ash.map",
        "benediti.map",
        "bubinga.map",
        "cedar.map",
        "marbteal.map",
        "orngwood.map",
        "pinkmarb.map",
        "rdgranit.map",
        "teak.map",
        "whiteash.map",
        "crystal.ttf",
        "cyrvetic.ttf",
        "povlogo.ttf",
        "timrom.ttf",
        "mtmand.pot",
        "spiral.df3",
        "Mount1.png",
        "Mount2.png",
        "bumpmap_.png",
        "fract003.png",
        "mtmandj.png",
        "plasma2.png",
        "plasma3.png",
        "povmap.png",
        "test.png",
    ]
)
"""The files POV-Ray 3.7 ships in its library directory (``/usr/share/povray-3.7/include``):
a scene naming one of them (``#include "colors.inc"``) gets the worker's copy, unless the
scene's own directory has a file of that name (POV-Ray looks there first)."""

# A token: a string literal, a comment, or anything else up to the next of those.
_POV_TOKEN = re.compile(r'"(?P<str>(?:[^"\\\n]|\\.)*)"|//[^\n]*|/\*.*?\*/|[^"/]+|/', re.S)
_POV_INCLUDE = re.compile(r"#\s*include\s*$")
_POV_FILE_TYPES = re.compile(
    r"\b(?P<kind>gif|tga|iff|ppm|pgm|png|jpeg|jpg|tiff|exr|hdr|sys|df3|ttf|pot)\s*$"
)


MAX_SCAN_BYTES = 16 * 1024 * 1024
"""POV-Ray files larger than this (exported meshes) are not scanned for the files they name
(by the client nor the gateway); they are uploaded all the same."""


@dataclass(frozen=True)
class PovReference:
    """A file a POV-Ray scene names with a literal string."""

    name: str
    kind: str
    """``include`` (a scene file that may name further files) or the file type (``png`` ...)."""

    @property
    def include(self) -> bool:
        """Whether the file is POV-Ray source (scanned in turn)."""
        return self.kind == "include"

    def candidates(self, where: str) -> list[str]:
        """Asset paths POV-Ray may open for this name, in order (it adds the extension of the
        type when the name has none). Raises ValidationError for a name outside the asset."""
        name = self.name.removeprefix("./")
        try:
            check_asset_path(name, "name")
        except (DecodeError, ValidationError) as exc:
            raise ValidationError(
                f"{where} names {self.name!r:.120}: not a file inside the scene's directory "
                f"({str(exc).removeprefix('name: ')})"
            ) from None
        last = name.rpartition("/")[2]
        if "." in last:
            return [name]
        return [name, f"{name}.{'inc' if self.include else self.kind}"]

    def is_library(self) -> bool:
        """A file of POV-Ray's own library (found by the worker's POV-Ray, not uploaded)."""
        return "/" not in self.name and self.name in POV_STANDARD_INCLUDES


def pov_references(text: str) -> list[PovReference]:
    """Files named by string literals in POV-Ray source ``text``, in order.

    ``#include "f"`` and a file after an image or data type keyword (``png "wood.png"`` in
    ``image_map``/``height_field``/``bump_map``/``material_map``, ``ttf "font.ttf"``,
    ``df3 "smoke.df3"`` ...). Comments are skipped. Not found here: a name built by an
    expression (``concat(...)``, a ``#declare``d string), which cannot be known before
    rendering, and ``#fopen`` files (read or written: the mode follows the name).
    """
    found: list[PovReference] = []
    before = ""
    for match in _POV_TOKEN.finditer(text):
        token = match.group(0)
        if token.startswith(("//", "/*")):
            continue
        name = match.group("str")
        if name is None:
            before = (before + token)[-64:]
            continue
        typed = _POV_FILE_TYPES.search(before)
        if _POV_INCLUDE.search(before):
            found.append(PovReference(name, "include"))
        elif typed is not None:
            found.append(PovReference(name, typed.group("kind")))
        before = ""
    return found


def pov_dependencies(
    main: str, read: Callable[[str], str | None], have: Callable[[str], bool]
) -> list[str]:
    """Every asset path a POV-Ray scene needs, ``main`` first, following ``#include`` files.

    ``read(path)`` is the text of a file to scan (None: too large to scan); ``have(path)``
    whether the asset (or the scene's directory) holds ``path``. Raises ValidationError naming
    the first file that is missing or outside the scene's directory; POV-Ray's own library
    files (:data:`POV_STANDARD_INCLUDES`) are left to the worker.
    """
    needed, queue = [main], [main]
    while queue:
        path = queue.pop(0)
        text = read(path)
        if text is None:
            continue
        for ref in pov_references(text):
            where = f"{path}"
            found = next((c for c in ref.candidates(where) if have(c)), None)
            if found is None:
                if ref.is_library():
                    continue
                raise ValidationError(
                    f"{where} needs {ref.name!r:.120} ({ref.kind}), which is not in the scene's "
                    "directory: a missing dependency"
                )
            if found not in needed:
                needed.append(found)
                if ref.include:
                    queue.append(found)
    return needed

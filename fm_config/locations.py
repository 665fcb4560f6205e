"""Where tables and reports live: a local path or a URI (``s3a://``, ``abfss://``, ``gs://``,
``hdfs://``, ``file://``), kept intact end to end.

Spark reads and writes the Delta tables at any of them through its Hadoop connectors. The
driver's own small files (a run's ``summary.json``, ``validation.json``, data docs) and the
CLI's reading of them (no Spark) go through pyarrow's filesystems, which take the same URIs
and, for S3, the same credentials (AWS environment variables, profile or instance role).
Conveniences of local paths (resolved under the project root, folders made) apply to local
paths only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
S3_SCHEMES = ("s3a", "s3n", "s3")


def is_uri(text: str) -> bool:
    return bool(URI.match(text))


class Location(str):
    """A local path or a URI; ``/`` joins a part on as the kind of location wants (a URI
    keeps its ``//``, which ``pathlib`` would collapse: ``s3a:/lake``)."""

    def __truediv__(self, part: str | os.PathLike) -> Location:
        part = os.fspath(part)
        if is_uri(self):
            return Location(self.rstrip("/") + "/" + part.lstrip("/"))
        return Location(os.path.join(self, part))

    @property
    def is_local(self) -> bool:
        return not is_uri(self)

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        if self.is_local:
            return Location(os.path.dirname(self.rstrip(os.sep)) or ".")
        return Location(self.rstrip("/").rsplit("/", 1)[0])

    def local_path(self) -> Path:
        """The path on this machine: a local path, or a ``file://`` URI's."""
        if self.is_local:
            return Path(self)
        parts = urlsplit(self)
        if parts.scheme != "file":
            raise ValueError(f"{self} is not on this machine's disk")
        return Path(parts.path)


def resolve(value: str | os.PathLike, root: Path) -> Location:
    """A conf or CLI location: a URI as it is, a relative local path under ``root``."""
    text = os.fspath(value)
    if is_uri(text) or os.path.isabs(text):
        return Location(text)
    return Location(os.path.join(root, text))


class Files:
    """The driver's small-file I/O at local paths and URIs (reports, data docs)."""

    def __init__(self, s3_endpoint: str | None = None, s3_region: str | None = None):
        self.s3_endpoint, self.s3_region = s3_endpoint, s3_region
        self._filesystems: dict[tuple[str, str], object] = {}

    def _open(self, where: str):
        """(pyarrow filesystem, path within it)."""
        from pyarrow import fs

        loc = Location(where)
        if loc.is_local or loc.startswith("file:"):
            return fs.LocalFileSystem(), str(loc.local_path())
        parts = urlsplit(loc)
        scheme = parts.scheme.lower()
        key = (scheme, parts.netloc)
        if scheme in S3_SCHEMES:
            got = self._filesystems.get(key)
            if got is None:
                options: dict = {"region": self.s3_region} if self.s3_region else {}
                if self.s3_endpoint:
                    endpoint = urlsplit(self.s3_endpoint)
                    options.update(endpoint_override=endpoint.netloc or endpoint.path, scheme=endpoint.scheme or "https")
                got = self._filesystems[key] = fs.S3FileSystem(**options)
            return got, parts.netloc + parts.path
        if scheme in ("abfs", "abfss"):  # abfss://container@account.dfs.core.windows.net/path
            container, _, host = parts.netloc.partition("@")
            got = self._filesystems.get(key) or self._filesystems.setdefault(key, fs.AzureFileSystem(account_name=host.split(".", 1)[0]))
            return got, container + parts.path
        try:
            filesystem, path = fs.FileSystem.from_uri(loc)  # gs://, hdfs://, ...
        except Exception as exc:  # pyarrow's errors name the scheme it lacks
            raise OSError(f"{loc}: cannot open this location from the driver: {exc}") from None
        return filesystem, path

    def read_bytes(self, where: str) -> bytes:
        filesystem, path = self._open(where)
        with filesystem.open_input_stream(path) as stream:
            return stream.read()

    def write_bytes(self, where: str, data: bytes) -> None:
        filesystem, path = self._open(where)
        if Location(where).is_local or where.startswith("file:"):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        with filesystem.open_output_stream(path) as out:
            out.write(data)

    def is_file(self, where: str) -> bool:
        from pyarrow import fs

        filesystem, path = self._open(where)
        return filesystem.get_file_info(path).type == fs.FileType.File

    def folders(self, where: str) -> list[str]:
        """The names of the folders directly in ``where`` (none when it does not exist)."""
        return self._names(where, directories=True)

    def file_names(self, where: str) -> list[str]:
        """The names of the files directly in ``where`` (none when it does not exist)."""
        return self._names(where, directories=False)

    def _names(self, where: str, *, directories: bool) -> list[str]:
        from pyarrow import fs

        filesystem, path = self._open(where)
        try:
            infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
        except NotADirectoryError:
            return []
        kind = fs.FileType.Directory if directories else fs.FileType.File
        return sorted(i.base_name for i in infos if i.type == kind)

    def upload(self, folder: Path, where: str) -> None:
        """Copy a local folder's files to ``where`` (same relative paths)."""
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.write_bytes(Location(where) / file.relative_to(folder).as_posix(), file.read_bytes())

"""A ``pyarrow.fs.FileSystem`` behind the few fsspec calls :class:`~pqloader._fs.Store` makes."""

from __future__ import annotations

from typing import Any


def is_arrow_fs(fs: Any) -> bool:
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pragma: no cover
        return False
    return isinstance(fs, pafs.FileSystem)


class ArrowFs:
    """The few fsspec calls pqloader makes, over a ``pyarrow.fs.FileSystem``."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    @staticmethod
    def _strip_protocol(url: str) -> str:
        return url.split("://", 1)[-1]

    @staticmethod
    def unstrip_protocol(path: str) -> str:
        return path

    def _info(self, fi: Any) -> dict[str, Any]:
        import pyarrow.fs as pafs

        kind = "directory" if fi.type == pafs.FileType.Directory else "file"
        return {"name": fi.path, "size": fi.size, "type": kind, "mtime": fi.mtime_ns}

    def info(self, path: str) -> dict[str, Any]:
        import pyarrow.fs as pafs

        fi = self.fs.get_file_info(path)
        if fi.type == pafs.FileType.NotFound:
            raise FileNotFoundError(path)
        return self._info(fi)

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def isdir(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(path).type == pafs.FileType.Directory)

    def find(self, path: str, detail: bool = True, withdirs: bool = False) -> dict[str, Any]:
        import pyarrow.fs as pafs

        if not self.isdir(path):
            return {path: self.info(path)}
        infos = self.fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return {i.path: self._info(i) for i in infos if i.type == pafs.FileType.File}

    def glob(self, pattern: str, detail: bool = True) -> dict[str, Any]:
        """Files matching ``pattern`` as fsspec matches them: ``*`` and ``?`` stay within one
        folder, ``**`` crosses folders (``fnmatch`` would let ``*`` match ``/`` too)."""
        import re

        from fsspec.utils import glob_translate

        base = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0].rsplit("/", 1)[0]
        match = re.compile(glob_translate(pattern)).match
        return {p: i for p, i in self.find(base).items() if match(p)}

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        with self.fs.open_input_file(path) as f:
            return bytes(f.read_at(end - start, start))

"""Read one fragment (a file's row group) into Arrow, projected and typed as the dataset says."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.parquet as pq

from ._discover import Discovery
from ._errors import CorruptFileError

_MAX_OPEN_FILES = 64


class FragmentReader:
    """Reads fragments of one dataset; cheap to pickle, opens files lazily per process and thread.

    File handles are never shared across ``fork`` (the pid is checked) nor across threads, so
    worker processes and reader threads each get their own.
    """

    def __init__(self, discovery: Discovery) -> None:
        self._d = discovery
        schema = discovery.schema
        parts = set(discovery.partition_schema.names)
        self._file_columns = [n for n in schema.names if n not in parts]
        self._local = threading.local()

    def __getstate__(self) -> dict[str, object]:
        return {"_d": self._d}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["_d"])  # type: ignore[misc]

    @property
    def discovery(self) -> Discovery:
        return self._d

    def _handle(self, file_index: int) -> pq.ParquetFile:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.pid = os.getpid()
            local.files = OrderedDict()
        files: OrderedDict[int, pq.ParquetFile] = local.files
        handle = files.get(file_index)
        if handle is None:
            entry = self._d.files[file_index]
            try:
                handle = pq.ParquetFile(entry.path, metadata=entry.metadata)
            except (pa.ArrowInvalid, OSError) as exc:
                raise CorruptFileError(f"{entry.path}: cannot open ({exc})") from exc
            files[file_index] = handle
            if len(files) > _MAX_OPEN_FILES:
                _, old = files.popitem(last=False)
                old.close()
        else:
            files.move_to_end(file_index)
        return handle

    def read(self, fragment: int) -> pa.Table:
        """The fragment's rows, with the dataset's columns in its schema's order and types."""
        d = self._d
        file_index = int(d.file_index[fragment])
        row_group = int(d.row_group[fragment])
        entry = d.files[file_index]
        try:
            table = self._handle(file_index).read_row_group(
                row_group, columns=self._file_columns, use_threads=True
            )
        except CorruptFileError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise CorruptFileError(
                f"{entry.path}: row group {row_group} does not decode ({exc}); the file is "
                "corrupt or truncated: rewrite it or remove it from the dataset"
            ) from exc
        if d.partition_schema.names:
            n = table.num_rows
            values = dict(entry.partition)
            for field in d.partition_schema:
                if d.schema.get_field_index(field.name) >= 0:
                    raw = values[field.name]
                    value = int(raw) if raw is not None and pa.types.is_integer(field.type) else raw
                    table = table.append_column(field, pa.repeat(pa.scalar(value, field.type), n))
        if table.schema.names != d.schema.names:
            table = table.select(d.schema.names)
        if not table.schema.equals(d.schema):
            table = table.cast(d.schema)
        return table

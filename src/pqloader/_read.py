"""Read one fragment (a file's row group) into Arrow, projected and typed as the dataset says."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from ._discover import Discovery
from ._errors import CorruptFileError


class FragmentReader:
    """Reads fragments of one dataset; cheap to pickle, safe in any thread or process.

    Each read opens its file with the footer already known and closes it at once: an open
    ``ParquetFile`` keeps its last row group's buffers (about one row group of memory per
    handle, measured), so caching handles made memory grow with the number of files.
    Nothing is shared across ``fork`` or threads.
    """

    def __init__(self, discovery: Discovery, *, verify_checksums: bool = False) -> None:
        self._d = discovery
        self.verify_checksums = verify_checksums
        # Footers of files opened from a manifest, read at their first use (a footer holds no
        # data buffers, unlike an open file); dict reads and writes are atomic across threads.
        self._footers: dict[int, pq.FileMetaData] = {}
        parts = set(discovery.partition_schema.names)
        self._file_columns = [n for n in discovery.schema.names if n not in parts]

    def __getstate__(self) -> dict[str, object]:
        return {"d": self._d, "verify": self.verify_checksums}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["d"], verify_checksums=state["verify"])  # type: ignore[misc]

    def _footer(self, file_index: int) -> pq.FileMetaData | None:
        entry = self._d.files[file_index]
        if entry.metadata is not None:
            return entry.metadata
        footer = self._footers.get(file_index)
        if footer is None:
            footer = pq.read_metadata(entry.path)
            self._footers[file_index] = footer
        return footer

    @property
    def discovery(self) -> Discovery:
        return self._d

    def read(self, fragment: int) -> pa.Table:
        """The fragment's rows, with the dataset's columns in its schema's order and types."""
        d = self._d
        file_index = int(d.file_index[fragment])
        row_group = int(d.row_group[fragment])
        entry = d.files[file_index]
        try:
            with pq.ParquetFile(entry.path, metadata=self._footer(file_index),
                                page_checksum_verification=self.verify_checksums) as handle:
                table = handle.read_row_group(row_group, columns=self._file_columns,
                                              use_threads=True)
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

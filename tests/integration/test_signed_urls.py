"""Presigned URLs against real S3 servers (moto, and Ceph's RGW, which checks signatures): a
signature is a credential that expires, not the object's name. URLs signed again hit the cache
and resume a saved state; no message and no cache entry shows a signature."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pqloader
from pqloader._cli import main
from pqloader._signed import redact, unsigned

ROWS = 3000


@pytest.fixture
def signed(s3_server: Any, tmp_path: Path) -> Any:
    """``sign(expires_s, version)``: presigned GET URLs of a 3-file dataset, sorted."""
    local = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"id": np.arange(ROWS)}), local, rows_per_file=1000,
                           row_group_size=500)
    (local / "_pqloader_manifest.json").unlink()  # files only: URLs are listed one by one
    bucket, prefix = s3_server.upload_dir(local).removeprefix("s3://").split("/", 1)
    names = sorted(p.name for p in local.glob("*.parquet"))

    def sign(expires_s: int, version: str) -> list[str]:
        client = s3_server.client(signature_version=version)
        return [client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": f"{prefix}/{n}".lstrip("/")},
            ExpiresIn=expires_s) for n in names]

    return sign


@pytest.mark.parametrize("version", ["s3v4", "s3"])
def test_urls_signed_again_hit_the_cache_and_resume(signed: Any, tmp_path: Path,
                                                    version: str) -> None:
    first = signed(3600, version)
    ds = pqloader.ParquetDataset(first, cache=tmp_path / "cache")
    loader = pqloader.DataLoader(ds, batch_size=100, shuffle=True, seed=2, num_workers=2)
    it = iter(loader)
    seen = [i for _ in range(5) for i in next(it)["id"].tolist()]
    state = loader.state_dict()
    for _ in it:  # the rest of the epoch, into the cache
        pass

    again = signed(1800, version)  # another expiry: other signatures
    assert again != first and [unsigned(u) for u in again] == [unsigned(u) for u in first]
    ds2 = pqloader.ParquetDataset(again, cache=tmp_path / "cache")
    resumed = pqloader.DataLoader(ds2, batch_size=100, shuffle=True, seed=2, num_workers=2)
    resumed.load_state_dict(state)  # was StateMismatchError: "another dataset"
    rest = [i for b in resumed for i in b["id"].tolist()]
    assert sorted(seen + rest) == list(range(ROWS))
    stats = ds2.io_stats()
    assert stats["requests"] == 0 and stats["cache_misses"] == 0, stats  # were all misses
    for entry in (tmp_path / "cache").rglob("*.pqc"):
        assert b"Signature=" not in entry.read_bytes()[:4096]  # the header names the object


def test_no_message_shows_a_signature(signed: Any) -> None:
    url = signed(3600, "s3v4")[0]
    secret = url.split("X-Amz-Signature=")[1].split("&")[0]
    wrong = url.replace("part-", "nopart-")  # the signature no longer matches: 403
    with pytest.raises(pqloader.PQLoaderError) as info:
        pqloader.ParquetDataset([wrong])
    assert secret not in str(info.value) and "X-Amz-Signature=REDACTED" in str(info.value)
    assert "nopart-00000.parquet" in str(info.value)  # still names the file
    # nor the traceback that logging.exception prints: the cause held the signed URL
    assert secret not in "".join(traceback.format_exception(info.value))


def test_inspect_shows_no_signature(signed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = signed(3600, "s3v4")[0]
    secret = url.split("X-Amz-Signature=")[1].split("&")[0]
    for extra in ([], ["--json"]):
        assert main(["inspect", url, *extra]) == 0
        out = capsys.readouterr().out
        assert secret not in out and "X-Amz-Signature=REDACTED" in out


def test_unsigned_and_redact() -> None:
    aws = ("https://b.s3.amazonaws.com/k/a.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256"
           "&X-Amz-Credential=AKIA%2F20261123%2Fus-east-1%2Fs3%2Faws4_request"
           "&X-Amz-Date=20261123T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
           "&X-Amz-Signature=deadbeef&versionId=7")
    assert unsigned(aws) == "https://b.s3.amazonaws.com/k/a.parquet?versionId=7"
    assert "deadbeef" not in redact(aws) and "AKIA" not in redact(aws)
    sas = "https://a.blob.core.windows.net/c/x.parquet?sv=2022-11-02&sp=r&se=2026-12-01&sig=a%3D"
    assert unsigned(sas) == "https://a.blob.core.windows.net/c/x.parquet"
    assert redact(f"'{sas}' failed") == f"'{sas.replace('sig=a%3D', 'sig=REDACTED')}' failed"
    plain = "http://h/x.parquet?sp=1&id=3"  # no signature: its parameters name the object
    assert unsigned(plain) == redact(plain) == plain
    v2 = ("https://s3.amazonaws.com/b/a.parquet?AWSAccessKeyId=ASIA&Signature=x%3D"
          "&x-amz-security-token=SESSION&Expires=1")  # temporary credentials: a session token
    assert unsigned(v2) == "https://s3.amazonaws.com/b/a.parquet"
    assert unsigned("/data/x?sig=1.parquet") == "/data/x?sig=1.parquet"  # a local file's name

"""The remote benchmark runs end to end in its tiny size: moto behind an nginx adding latency."""

from __future__ import annotations

import shutil
from typing import Any

import pytest


@pytest.mark.slow
def test_bench_remote_tiny(run_bench: Any) -> None:
    pytest.importorskip("psutil")
    pytest.importorskip("s3fs")
    if shutil.which("nginx") is None and not shutil.which("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed: apt-get install -y nginx-light")
    result: Any = run_bench("bench_remote")
    assert result["benchmark"] == "remote"
    methods = result["methods"]
    assert set(methods) == {"local", "s3-nocache", "s3-cold", "s3-warm"}
    for method, summary in methods.items():
        assert not summary["errors"], (method, summary["errors"])
        assert all(run["rows"] == result["rows"] for run in summary["runs"]), method
    assert methods["s3-cold"]["requests"] > 1
    assert methods["s3-warm"]["requests"] <= 1  # the manifest; every data byte from the cache

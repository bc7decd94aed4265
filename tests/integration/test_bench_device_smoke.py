"""The device benchmark runs end to end in its tiny size; its CUDA methods run where torch sees
a device and are listed as skipped elsewhere."""

from __future__ import annotations

from typing import Any

import pytest
import torch

DEVICE_METHODS = {"cuda", "cuda-pinned", "cuda-device"}


@pytest.mark.slow
def test_bench_device_tiny(run_bench: Any) -> None:
    pytest.importorskip("psutil")
    result: Any = run_bench("bench_device")
    ran = {"floor", "host"} | (DEVICE_METHODS if torch.cuda.is_available() else set())
    assert set(result["methods"]) == ran
    assert set(result["skipped"]) == {"floor", "host", *DEVICE_METHODS} - ran
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert all(run["rows"] == result["rows"] for run in summary["runs"]), method

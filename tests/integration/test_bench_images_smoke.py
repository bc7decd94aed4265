"""The image benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

from typing import Any

import pytest

METHODS = {"floor-threads", "floor-procs", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2",
           "pqloader-auto",
           "pqloader-w2-proc"}
WHOLE_EPOCH = METHODS - {"naive-w0", "naive-w2"}


@pytest.mark.slow
def test_bench_images_tiny(run_bench: Any) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("psutil")
    pytest.importorskip("simplejpeg")
    result: Any = run_bench("bench_images")
    assert result["benchmark"] == "images"
    assert set(result["methods"]) == METHODS
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert summary["images_per_s"] > 0, method
        assert summary["peak_rss_mib"] > 0, method
    runs = [run for m in WHOLE_EPOCH for run in result["methods"][m]["runs"]]
    assert {run["rows"] for run in runs} == {result["rows"]}
    assert len({run["label_sum"] for run in runs}) == 1  # every row once, in every method
    corners = {run["corner_sum"] for m in ("pqloader-w2", "pqloader-w2-proc")
               for run in result["methods"][m]["runs"]}
    assert len(corners) == 1  # the same seeded augmentation in threads and processes
    for method in METHODS - WHOLE_EPOCH:
        for run in result["methods"][method]["runs"]:
            assert run["rows"] == result["naive_batches"] * result["batch_size"]

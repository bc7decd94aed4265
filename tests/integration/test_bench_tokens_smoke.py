"""The token-list benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

from typing import Any

import pytest

METHODS = {"floor", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2"}
WHOLE_EPOCH = {"floor", "pqloader-w0", "pqloader-w2"}


@pytest.mark.slow
def test_bench_tokens_tiny(run_bench: Any) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("psutil")
    result: Any = run_bench("bench_tokens")
    assert result["benchmark"] == "tokens"
    assert set(result["methods"]) == METHODS
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert summary["tokens_per_s"] > 0, method
        assert summary["peak_rss_mib"] > 0, method
        assert 0 < summary["fill"] <= 1, method
    total = result["total_tokens"]
    assert total >= 32 * result["rows"]
    runs = [run for m in WHOLE_EPOCH for run in result["methods"][m]["runs"]]
    assert {run["tokens"] for run in runs} == {total}
    assert len({run["token_sum"] for run in runs}) == 1  # the same tokens, padding excluded
    for method in METHODS - WHOLE_EPOCH:
        for run in result["methods"][method]["runs"]:
            assert run["batches"] == result["naive_batches"]
            assert 0 < run["tokens"] <= 512 * result["batch_size"] * run["batches"]

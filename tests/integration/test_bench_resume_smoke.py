"""The resume benchmark runs end to end in its tiny size, checks its batches and prints RESULT."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.slow
def test_bench_resume_tiny(run_bench: Any) -> None:
    pytest.importorskip("psutil")  # bench_resume reuses bench_tabular's data, which imports it
    result: Any = run_bench("bench_resume")
    assert result["benchmark"] == "resume"
    cells = {(r["position"], r["workers"]) for r in result["results"]}
    assert cells == {(p, n) for p in (0.0, 0.5) for n in (0, 2)}
    for r in result["results"]:
        assert not r["errors"], r["errors"]
        assert 0 <= r["batch"] < result["num_batches"]
        for kind in ("restore", "replay"):
            assert len(r[kind]["runs"]) == result["repeats"] == 1
            assert r[kind]["seconds"] > 0
        assert all(run["matches_reference"] for run in r["restore"]["runs"])
        digests = {run["digest"] for kind in ("restore", "replay") for run in r[kind]["runs"]}
        assert len(digests) == 1, r  # both ways delivered the same batch
    batches = {r["position"]: r["batch"] for r in result["results"]}
    assert batches[0.0] == 0 < batches[0.5] < result["num_batches"] - 1

"""The peer code path of W1 and W2 runs end to end at tiny size, in the peers' own venvs.

Skipped unless the venvs exist: making them takes pip and minutes, which the test suite must not
do (``.venv/bin/python benchmarks/peers.py lance hf`` makes them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("lance", "hf-map-batched")  # the two quickest to start; one converts, one does not
VENVS = ("lance", "hf")


@pytest.mark.slow
@pytest.mark.parametrize("bench", ["bench_tabular", "bench_tokens"])
def test_bench_peers_tiny(bench: str, tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    missing = [v for v in VENVS if not (ROOT / ".venv-peers" / v / "ready").exists()]
    if missing:
        pytest.skip(f"peer venvs {missing} are absent under .venv-peers/; make them with "
                    f"`.venv/bin/python benchmarks/peers.py {' '.join(VENVS)}` (pip, minutes)")
    # --peer-seconds is a cap: a tiny epoch ends well within it, even on a loaded machine
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{bench}.py"), "--tiny", "--data",
         str(tmp_path / "data"), "--methods", ",".join(("floor", *PEERS)), "--peer-seconds", "30"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    methods = json.loads(line.removeprefix("RESULT "))["methods"]
    assert set(methods) == {"floor", *PEERS}
    rate = "rows_per_s" if bench == "bench_tabular" else "tokens_per_s"
    for method in PEERS:
        s = methods[method]
        assert not s["errors"], (method, s["errors"])
        assert s[rate] > 0 and s["first_batch_s"] >= 0, method
        assert s["x_best_hf"] > 0, method
    assert methods["lance"]["convert_s"] is not None
    # Lance reaches the end of the tiny epoch: summarise checked its sums against the floor's
    assert all(run["whole_epoch"] for run in methods["lance"]["runs"])

"""What every benchmark's parent does: run each method in a fresh child, watch its memory,
interleave the repeats, and note the commit measured.

A child is this same script run with ``--child METHOD ...``; it prints one ``CHILD {json}`` line.
Children may run in a peer's venv (``peers.py``), which has no psutil: only the parent imports it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

MIB = 2**20
SAMPLE_S = 0.02  # RSS of the tree every 20 ms ...
TREE_EVERY = 5  # ... its process list and PSS every 5 samples (100 ms): they cost ~1-2 ms


def _tree_memory(tree: list[psutil.Process], pss: bool) -> int:
    import psutil

    total = 0
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_full_info().pss if pss else p.memory_info().rss
    return total


def watch(proc: subprocess.Popen[str]) -> tuple[int, int]:
    """Peak RSS and PSS (bytes) of ``proc`` and its recursive children until it exits.

    RSS counts a page shared by several processes (forked workers) once per process; PSS
    splits it between them, so the tree's PSS is what the tree really holds.
    """
    import psutil

    root = psutil.Process(proc.pid)
    tree, peak_rss, peak_pss = [root], 0, 0
    for tick in itertools.count():
        if proc.poll() is not None:
            break
        if tick % TREE_EVERY == 0:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            peak_pss = max(peak_pss, _tree_memory(tree, pss=True))
        peak_rss = max(peak_rss, _tree_memory(tree, pss=False))
        time.sleep(SAMPLE_S)
    return peak_rss, peak_pss


def run_child(script: str, method: str, argv: list[str],
              python: str | Path = sys.executable) -> dict[str, Any]:
    """Run ``python script --child METHOD argv...``: its result, with the tree's peak memory in
    MiB, or ``{"error": last line of stderr}``. ``python``: a peer venv's interpreter."""
    cmd = [str(python), script, "--child", method, *argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        peak_rss, peak_pss = watch(proc)
        proc.wait()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("CHILD ")]
        if proc.returncode != 0 or not lines:
            stderr = err.read().strip()
            print(f"{method} failed (exit code {proc.returncode}):\n{stderr}", file=sys.stderr)
            last = stderr.splitlines()[-1] if stderr else f"exit code {proc.returncode}"
            last = last if len(last) <= 300 else last[:300] + " ..."  # some embed their data
            return {"error": last}
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("CHILD "))
    result.update(peak_rss_mib=round(peak_rss / MIB), peak_pss_mib=round(peak_pss / MIB))
    return result


def interleave(methods: list[str], repeats: int, run: Callable[[str], dict[str, Any]],
               describe: Callable[[dict[str, Any]], str]) -> dict[str, list[dict[str, Any]]]:
    """Run every method ``repeats`` times, rotating their order each round so that the
    machine's noise hits them alike; print a progress line per run."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for repeat in range(repeats):
        k = repeat % len(methods)  # no method always goes first
        for method in methods[k:] + methods[:k]:
            r = run(method)
            runs[method].append(r)
            note = r.get("error") or f"{describe(r)}, peak RSS {r['peak_rss_mib']:,} MiB"
            print(f"[{repeat + 1}/{repeats}] {method}: {note}", file=sys.stderr)
    return runs


def paired(runs: list[dict[str, Any]], base_runs: list[list[dict[str, Any]]],
           key: str) -> float | None:
    """The median over rounds of a run's ``key`` rate over the fastest base's in that round.

    The runs of one round are seconds to minutes apart, so on a shared machine they see a
    similar load: this ratio is steadier than the ratio of the medians, which pairs a method's
    median round with a base's median round, maybe not the same one.
    """
    ratios = []
    for i, r in enumerate(runs):
        bases = [b[i][key] for b in base_runs if i < len(b) and key in b[i]]
        if key in r and bases:
            ratios.append(r[key] / max(bases))
    return statistics.median(ratios) if ratios else None


def commit() -> str | None:
    """The checkout's commit, so that numbers can be matched with the code they measured."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def modified(package: Path) -> list[str] | None:
    """Files of the measured package that differ from the commit (others edit src/ meanwhile)."""
    try:
        return subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True,
                              text=True, check=True, cwd=package).stdout.split("\n")[:-1]
    except (OSError, subprocess.CalledProcessError):
        return None  # not in a checkout (a snapshot on PYTHONPATH, an installed wheel)

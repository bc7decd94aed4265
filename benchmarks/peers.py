"""The peers' virtual environments: one per peer under ``.venv-peers/NAME/``, made on demand.

Each peer gets its own venv because several conflict with the main one (Petastorm needs pyarrow
14 and numpy < 2; MosaicML Streaming pins numpy < 2.2 and pulls a CUDA torchvision). torch is
installed first from the local CPU wheel and pinned by a constraints file (``PIP_CONSTRAINT``)
for every later install, so that no peer can replace it with a CUDA build.

    .venv/bin/python benchmarks/peers.py hf ray   # make these venvs now (also done on demand)

Only the parent imports this module; the children run with the peer's python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venv-peers"
TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Peer:
    """A peer's environment: what to pin, what to install, how to install it."""

    packages: tuple[str, ...]
    pins: tuple[str, ...] = ()  # constraints on top of torch's, for every install
    no_deps: tuple[str, ...] = ()  # installed last with --no-deps (their deps listed above)
    check: str = ""  # a python statement that must run once installed


PEERS = {
    "hf": Peer(("datasets", "pyarrow", "numpy"), check="import datasets"),
    "petastorm": Peer(("petastorm", "pyarrow", "numpy", "pandas"),
                      pins=("pyarrow==14.0.2", "numpy<2", "pandas<2.3"),
                      check="from petastorm import make_batch_reader"),
    # streaming imports torchvision at import time (streaming.vision), and the torchvision that
    # pip resolves is CUDA-linked; the child imports streaming.base without the package's
    # __init__ instead. Its cloud SDKs (boto3, google, azure, oci, paramiko) are imported lazily.
    "mosaic": Peer(("numpy<2.2", "pyarrow", "Brotli", "python-snappy", "xxhash", "zstd", "tqdm",
                    "catalogue", "filelock", "pillow", "transformers<5"),
                   no_deps=("mosaicml-streaming",)),
    "ray": Peer(("ray[data]", "pydantic", "pyarrow", "numpy", "pandas"), check="import ray.data"),
    "lance": Peer(("pylance", "pyarrow", "numpy"), check="import lance.torch.data"),
}


def prepare(script: str, methods: list[str], argv: list[str],
            venv_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """For each peer method: make its venv, then have a child in it convert the data once
    (``script --child METHOD --prepare argv...``). Returns per method ``{"python": ...,
    "convert_s": ...}`` or ``{"error": why}`` (the venv or the conversion failed)."""
    import harness

    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        try:
            py = ensure(venv_of[method])
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            out[method] = {"error": str(exc).replace("\n", " | ")}
            continue
        result = harness.run_child(script, method, [*argv, "--prepare"], python=py)
        if "error" in result:
            out[method] = {"error": result["error"]}
            continue
        out[method] = {"python": str(py), **result}
        if result.get("convert_s") is not None:
            how = "reused" if result.get("reused") else "converted"
            print(f"{method}: data {how}, conversion {result['convert_s']:.0f} s, peak RSS "
                  f"{result['peak_rss_mib']:,} MiB", file=sys.stderr)
    return out


def python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ready(name: str) -> bool:
    return (VENVS / name / "ready").exists()


def ensure(name: str) -> Path:
    """The peer's python, after making its venv if it is not ready; raises ``RuntimeError``
    with pip's last lines if an install fails."""
    peer, venv = PEERS[name], VENVS / name
    if ready(name):
        return python(name)
    print(f"making {venv} (torch first, then {', '.join(peer.packages + peer.no_deps)}) ...",
          file=sys.stderr)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join([TORCH, *peer.pins]) + "\n")
    env = {**os.environ, "PIP_CONSTRAINT": str(constraints), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    steps = [[TORCH], list(peer.packages)]
    if peer.no_deps:
        steps.append(["--no-deps", *peer.no_deps])
    for step in steps:
        proc = subprocess.run([str(python(name)), "-m", "pip", "install", "-q", *step], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"pip install {' '.join(step)} into {venv} failed:\n{tail}")
    if "torchvision" in subprocess.run([str(python(name)), "-m", "pip", "list"], env=env,
                                       capture_output=True, text=True).stdout:
        raise RuntimeError(f"{venv}: torchvision was installed; it must stay out")
    if peer.check:
        proc = subprocess.run([str(python(name)), "-c", peer.check], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{venv}: {peer.check!r} failed: "
                               f"{proc.stderr.strip().splitlines()[-1]}")
    (venv / "ready").write_text(f"{time.perf_counter() - t0:.0f} s\n")
    print(f"  {venv} ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return python(name)


if __name__ == "__main__":
    failed = 0
    for peer_name in sys.argv[1:] or list(PEERS):
        try:
            ensure(peer_name)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"{peer_name}: {exc}", file=sys.stderr)
            failed = 1
    sys.exit(failed)

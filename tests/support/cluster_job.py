"""A multi-node job on one machine: each "node" is a torchrun agent (or a set of srun-like
tasks) with its own recorded NVML machine (A2A_TUNE_NVML_RECORDING), its own HOME and
XDG_DATA_HOME (where `a2a-tune run` writes the table and lookup looks), all meeting on
127.0.0.1 over gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
CLI = [sys.executable, "-m", "a2a_tune.tuner.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recording(tmp: Path, fixture: str, hostname: str, **changes) -> Path:
    """A copy of an NVML fixture as host `hostname` (two nodes of one machine model need two
    names); `changes` set top-level answers (e.g. driver_version), `gpu_links_down` takes
    NVLinks of GPU 0 down."""
    data = json.loads((FIXTURES / fixture).read_text())
    data["hostname"] = hostname
    for link in data["devices"][0]["nvlinks"][: changes.pop("gpu_links_down", 0)]:
        link["state"] = False
    data.update(changes)
    path = tmp / f"{hostname}.nvml.json"
    path.write_text(json.dumps(data))
    return path


@dataclass
class Node:
    """One simulated node: its machine, its home, its environment."""

    index: int
    recording: Path
    root: Path

    @property
    def xdg(self) -> Path:
        return self.root / "xdg"

    @property
    def profiles(self) -> Path:
        return self.xdg / "a2a-tune" / "profiles"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "A2A_TUNE_PROFILE_DIR"):
            env.pop(key, None)
        env.update(
            HOME=str(self.root / "home"),
            XDG_DATA_HOME=str(self.xdg),
            A2A_TUNE_NVML_RECORDING=str(self.recording),
            A2A_TUNE_BACKEND_MODULES="reach_backends",
            COLUMNS="200",
            **extra,
        )
        return env


def nodes(tmp: Path, recordings: list[Path]) -> list[Node]:
    out = []
    for i, rec in enumerate(recordings):
        root = tmp / f"node{i}"
        (root / "home").mkdir(parents=True, exist_ok=True)
        out.append(Node(i, rec, root))
    return out


def torchrun(node: Node, n_nodes: int, per_node: int, port: int, args: list[str], **env: str) -> subprocess.Popen:
    """Node `node.index`'s torchrun agent running `a2a-tune ARGS` on `per_node` ranks."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={n_nodes}",
        f"--node-rank={node.index}",
        f"--nproc-per-node={per_node}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "a2a_tune.tuner.cli",
        *args,
    ]
    return subprocess.Popen(
        cmd, env=node.env(**env), cwd=node.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def srun(node: Node, n_nodes: int, per_node: int, port: int, args: list[str], **env: str) -> list[subprocess.Popen]:
    """The tasks srun would start on node `node.index` (no torchrun): Slurm's variables only."""
    world = n_nodes * per_node
    procs = []
    for local in range(per_node):
        slurm = dict(
            SLURM_JOB_ID="4242",
            SLURM_PROCID=str(node.index * per_node + local),
            SLURM_LOCALID=str(local),
            SLURM_NODEID=str(node.index),
            SLURM_NTASKS=str(world),
            SLURM_NNODES=str(n_nodes),
            SLURM_JOB_NODELIST=f"node[0-{n_nodes - 1}]",
            SLURM_NODELIST=f"node[0-{n_nodes - 1}]",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [*CLI, *args],
                env=node.env(**slurm, **env),
                cwd=node.root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def lookup(node: Node, *args: str) -> dict:
    """`a2a-tune lookup --format json ARGS` as an engine on `node` would run it (no fingerprint)."""
    r = subprocess.run(
        [*CLI, "lookup", "--format", "json", *args],
        env=node.env(),
        cwd=node.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)

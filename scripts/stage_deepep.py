#!/usr/bin/env python3
"""Build DeepEP from its source for this machine's GPUs into a folder to put on PYTHONPATH.

DeepEP has no wheel that fits every torch (its extension is compiled against one torch's C++
ABI), so a2a-tune's DeepEP backends (`deepep_high_throughput`, `deepep_low_latency`) run a
build made here, with the torch that will run it, for the GPUs' arch:

    python scripts/stage_deepep.py --source ~/src/DeepEP        # a checkout you provide
    python scripts/stage_deepep.py --git https://github.com/deepseek-ai/DeepEP --commit 73b6ea4
    PYTHONPATH=$PWD/.deepep/site a2a-tune backends              # deepep_* available?

The source must have DeepEP's V1 API (`deep_ep/buffer.py`: `Buffer.dispatch`, `combine`,
`low_latency_dispatch`, `low_latency_combine`), e.g. commit 73b6ea4, the one vLLM builds;
DeepEP's V2 (`ElasticBuffer`) needs NCCL >= 2.30. `--git` clones it (where the network is
reachable); `--source` takes a tree already here (a machine without network).

Steps: copy the tree to a scratch folder; run DeepEP's `setup.py build_ext` there with
TORCH_CUDA_ARCH_LIST = the arch (`--arch`, default: GPU 0's compute capability), NVSHMEM from
`$NVSHMEM_DIR` or the nvidia-nvshmem wheel (DeepEP's setup finds it; without it only the
intranode kernels are built), and CUDA 13's CCCL headers on CPATH (CUDA 13 moved them under
include/cccl); then write OUT/site/ (the `deep_ep` package and its `deep_ep_cpp` extension)
and OUT/STAGED (what was built from what). OUT (default `.deepep/`) is git-ignored: nothing
of DeepEP is ever committed. Needs here: nvcc, the torch that will run the build (imported
to find its headers), ninja for a parallel build (minutes otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NVSHMEM_HOST = b"libnvshmem_host.so"
V1_MARKERS = ("class Buffer", "def low_latency_dispatch", "def low_latency_combine", "def get_dispatch_layout")


def log(msg: str) -> None:
    print(f"[stage_deepep] {msg}", flush=True)


def fail(msg: str) -> None:
    sys.exit(f"[stage_deepep] error: {msg}")


def check_tree(src: Path) -> None:
    """A DeepEP source tree with the V1 API, or a one-line exit."""
    if not src.is_dir():
        fail(f"--source {src}: no such folder")
    buffer = src / "deep_ep" / "buffer.py"
    if not (src / "setup.py").is_file() or not (src / "deep_ep").is_dir():
        fail(f"{src} is not a DeepEP source tree (no setup.py and deep_ep/)")
    text = buffer.read_text(errors="replace") if buffer.is_file() else ""
    if not all(m in text for m in V1_MARKERS):
        fail(
            f"{src} has not DeepEP's V1 API (deep_ep/buffer.py with Buffer.low_latency_dispatch): "
            "check out a V1 commit, e.g. 73b6ea4 (what vLLM builds)"
        )


def clone(url: str, commit: str | None, dest: Path) -> Path:
    log(f"cloning {url}" + (f" at {commit}" if commit else ""))
    subprocess.run(["git", "clone", "--quiet", url, str(dest)], check=True)
    if commit:
        subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", commit], check=True)
    return dest


def revision(src: Path) -> str | None:
    """The commit of `src` when it is a git checkout of its own (not a folder inside another one)."""
    git = ["git", "-C", str(src), "rev-parse", "--show-toplevel", "HEAD"]
    done = subprocess.run(git, capture_output=True, text=True)
    lines = done.stdout.split()
    if done.returncode or len(lines) != 2 or Path(lines[0]).resolve() != src.resolve():
        return None
    return lines[1]


def gpu_arch() -> str | None:
    """GPU 0's compute capability as TORCH_CUDA_ARCH_LIST writes it ("9.0"), or None."""
    code = "import torch; c = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None; print(c)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    out = done.stdout.strip()
    if done.returncode or out in ("", "None"):
        return None
    major, minor = (int(v) for v in out.strip("()").split(","))
    return f"{major}.{minor}"


def cuda_home() -> Path | None:
    nvcc = shutil.which("nvcc")
    for c in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        if (Path(c) / "bin" / "nvcc").exists():
            return Path(c)
    return Path(nvcc).resolve().parent.parent if nvcc else None


def build_env(arch: str, home: Path, jobs: int) -> dict[str, str]:
    """The environment of DeepEP's setup.py for `arch`."""
    env = dict(os.environ)
    env["TORCH_CUDA_ARCH_LIST"] = arch
    env["CUDA_HOME"] = str(home)
    env["MAX_JOBS"] = str(jobs)
    cccl = home / "include" / "cccl"  # CUDA 13: cuda/std/... live here
    if cccl.is_dir():
        env["CPATH"] = os.pathsep.join(filter(None, [str(cccl), env.get("CPATH")]))
    return env


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", type=Path, help="a DeepEP source tree (V1 API)")
    where.add_argument("--git", metavar="URL", help="clone DeepEP from URL (needs the network)")
    ap.add_argument("--commit", help="with --git: the commit to check out (e.g. 73b6ea4)")
    ap.add_argument("--out", type=Path, default=Path(".deepep"), help="output folder; PYTHONPATH=<out>/site")
    ap.add_argument("--arch", help="CUDA arch of the GPUs that will run it, e.g. 9.0 (default: GPU 0's)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs")
    ap.add_argument("--dry-run", action="store_true", help="check the tree and print the build's settings only")
    args = ap.parse_args()

    if args.source is not None:
        check_tree(args.source)  # before anything slow: a wrong folder is a one-line answer
    arch = args.arch or gpu_arch()
    if arch is None:
        fail("no GPU visible to find the arch: pass --arch (9.0 for H100/H200, 10.0 for B200)")
    if tuple(int(v) for v in arch.split(".")[:2]) < (9, 0):
        fail(f"arch {arch}: a2a-tune's DeepEP backends need its SM90 build (compute capability >= 9.0)")
    home = cuda_home()

    with tempfile.TemporaryDirectory(prefix="stage_deepep-") as tmp:
        scratch = Path(tmp) / "src"
        src = clone(args.git, args.commit, scratch) if args.git else args.source.resolve()
        check_tree(src)
        rev = revision(src)
        settings = {
            "source": args.git or str(src),
            "revision": rev,
            "arch": arch,
            "cuda_home": str(home) if home else None,
        }
        if args.dry_run:
            print(json.dumps(settings, indent=1))
            return
        if home is None:
            fail("nvcc not found (set CUDA_HOME to a CUDA toolkit)")
        env = build_env(arch, home, args.jobs)
        settings["cpath"] = env.get("CPATH")
        if not args.git:
            shutil.copytree(src, scratch, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.so"))
        lib = Path(tmp) / "lib"
        log(f"building deep_ep_cpp for sm_{arch.replace('.', '')} ({args.jobs} jobs)")
        cmd = [sys.executable, "setup.py", "build_ext", "--build-lib", str(lib), "--build-temp", str(Path(tmp) / "obj")]
        done = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-6000:])
            fail(f"DeepEP's build failed (exit {done.returncode}); its output is above")
        built = sorted(lib.glob("deep_ep_cpp*.so"))
        if not built:
            fail(f"the build wrote no deep_ep_cpp*.so into {lib}")
        # Built with NVSHMEM when linked against its host library (what availability() reads too).
        nvshmem = NVSHMEM_HOST in built[0].read_bytes()
        nvshmem_path = next(
            (ln.split(":", 1)[1].strip() for ln in done.stdout.splitlines() if "NVSHMEM path" in ln), None
        )
        site = args.out / "site"
        shutil.rmtree(args.out, ignore_errors=True)
        shutil.copytree(scratch / "deep_ep", site / "deep_ep", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(built[0], site / built[0].name)
    settings.update(
        extension=built[0].name,
        nvshmem=nvshmem,
        nvshmem_path=nvshmem_path,
        torch=_torch_version(),
        python=sys.version.split()[0],
    )
    (args.out / "STAGED").write_text(json.dumps(settings, indent=1) + "\n")
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    log(
        f"staged deep_ep ({rev or 'no git revision'}, sm_{arch.replace('.', '')}, NVSHMEM {'on' if nvshmem else 'off'})"
    )
    log(f"into {site}: {size / 2**20:.1f} MiB; use PYTHONPATH={site.resolve()}")


def _torch_version() -> str:
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return done.stdout.strip()


if __name__ == "__main__":
    main()

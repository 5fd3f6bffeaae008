#!/usr/bin/env python3
"""Stage the part of FlashInfer that a2a-tune's FlashInfer backends use, small enough to carry.

The flashinfer-python wheel is ~62 MB (most of it kernel sources of unrelated families) and
its package `__init__`s import every kernel family, which costs seconds and pulls optional
dependencies. The two backends need only the NVLink MoE all2all path: `flashinfer.comm.
trtllm_moe_alltoall` (one-sided, `MoeAlltoAll`) and `flashinfer.comm.trtllm_alltoall`
(two-sided, `MnnvlMoe`). This script, from the wheels:

Nothing of FlashInfer is ever committed: OUT is in .gitignore. Use OUT as PYTHONPATH
(`PYTHONPATH=.flashinfer/site`); scripts/device_run.sh does when it finds it.

    python scripts/stage_flashinfer.py                      # sm_90a (H100/H200), Python 3.12 runtime
    python scripts/stage_flashinfer.py --arch 10.0a --python-version 3.12

Needs here: pip (to fetch wheels unless --wheel-dir has them), nvcc >= 12.8 and ninja, and the
cuBLAS headers (TensorRT-LLM's common header includes cublasLt.h): taken from --cublas-include,
CUDA's own include folder, or the nvidia-cublas wheel's headers (downloaded, ~420 MB, once).

Design notes: docs/architecture.md, "Module notes", `scripts/stage_flashinfer.py`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

FLASHINFER_VERSION = "0.7.2.post1"
TVM_FFI_VERSION = "0.1.15.post2"
ENTRY_MODULES = ("flashinfer.comm.trtllm_moe_alltoall", "flashinfer.comm.trtllm_alltoall")
# The JIT modules behind the entry points: (generator in flashinfer.jit.comm, call arguments).
JIT_MODULES = {"mnnvl_moe_alltoall": 'gen_moe_alltoall_module("legacy")', "comm": "gen_comm_alltoall_module()"}
# Package __init__s replaced: the real ones import every kernel family.
MINIMAL_INITS = {
    "flashinfer/__init__.py": "from .version import __version__ as __version__  # staged by a2a-tune\n",
    "flashinfer/comm/__init__.py": "# staged by a2a-tune: import submodules directly\n",
}
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "a2a-tune" / "wheels"


def log(msg: str) -> None:
    print(f"[stage_flashinfer] {msg}", flush=True)


def pip_download(spec: str, dest: Path, *, python_version: str | None, binary_platforms: bool) -> Path:
    """The wheel of `spec` in `dest`, downloaded with pip when not there yet."""
    name = spec.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-{spec.split('==')[1]}-*.whl")) if "==" in spec else []
    if python_version:
        tag = "cp" + python_version.replace(".", "")
        found = [w for w in found if f"-{tag}-" in w.name or "-py3-" in w.name]
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec]
    if python_version:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
    if binary_platforms:
        for plat in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
        ):
            cmd += ["--platform", plat]
    log("downloading " + spec)
    subprocess.run(cmd, check=True)
    return pip_download(spec, dest, python_version=python_version, binary_platforms=False)


def import_closure(env: dict[str, str], site: Path) -> list[Path]:
    """Files of the flashinfer modules that importing ENTRY_MODULES loads (parents included).

    Measured by importing, not by reading imports: function-level imports of the kernel
    families would pull in most of the package. Lazy imports on the all2all path (logging,
    tracing) are not needed by the backends; one that were would fail as an ImportError in
    the backend's construction, not silently."""
    code = (
        "import sys\n"
        f"for m in {ENTRY_MODULES!r}: __import__(m)\n"
        "for name, mod in sorted(sys.modules.items()):\n"
        "    f = getattr(mod, '__file__', None)  # None: a namespace package, no file of its own\n"
        "    if f and (name == 'flashinfer' or name.startswith('flashinfer.')): print(f)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"[stage_flashinfer] importing the all2all path failed:\n{done.stderr[-4000:]}")
    files = [Path(line) for line in done.stdout.split()]
    outside = [f for f in files if site not in f.parents]
    if outside:
        sys.exit(f"[stage_flashinfer] flashinfer imported from outside the scratch tree: {outside[0]}")
    return files


def cuda_home() -> Path:
    """The CUDA toolkit folder (include/, lib64/libcudart.so), whatever wraps nvcc on PATH."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for c in filter(None, candidates):
        if (Path(c) / "lib64" / "libcudart.so").exists() and (Path(c) / "bin" / "nvcc").exists():
            return Path(c)
    sys.exit(
        "[stage_flashinfer] no CUDA toolkit found (set CUDA_HOME to a folder with bin/nvcc and lib64/libcudart.so)"
    )


def cublas_include(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else []
    candidates += [cuda_home() / "include", CACHE / "cublas-include"]
    for c in candidates:
        if (c / "cublasLt.h").is_file():
            return c
    wheel = pip_download("nvidia-cublas==13.1.2.11", CACHE, python_version="3.12", binary_platforms=True)
    dest = CACHE / "cublas-include"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if "/include/" in name and name.endswith(".h"):
                (dest / Path(name).name).write_bytes(zf.read(name))
    return dest


def scratch_env(scratch: Path, arch: str, cublas: Path, jobs: int) -> dict[str, str]:
    """Environment of the build and import subprocesses: the scratch tree first on the path."""
    env = dict(os.environ)
    home = cuda_home()
    # The modules call the driver API: link against a stub with the driver's soname, so that
    # building needs no driver here and the GPU machine's real libcuda.so.1 is loaded there.
    stub = scratch / "driver-stub"
    stub.mkdir(exist_ok=True)
    subprocess.run(
        ["cc", "-shared", "-x", "c", os.devnull, "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so")], check=True
    )
    env.update(
        CUDA_HOME=str(home),
        LIBRARY_PATH=os.pathsep.join(filter(None, [str(stub), str(home / "lib64"), env.get("LIBRARY_PATH", "")])),
        FLASHINFER_CUDA_ARCH_LIST=arch,
        FLASHINFER_WORKSPACE_BASE=str(scratch / "ws"),
        MAX_JOBS=str(jobs),
        # the host compiler needs CUDA's headers too (TensorRT-LLM's .cpp files include them)
        CPATH=os.pathsep.join(filter(None, [str(cublas), str(home / "include"), env.get("CPATH", "")])),
        PYTHONPATH=os.pathsep.join(filter(None, [str(scratch / "site"), str(scratch / "deps"), env.get("PYTHONPATH")])),
    )
    return env


def build_aot(env: dict[str, str], arch: str) -> dict[str, Path]:
    """Build the JIT modules with FlashInfer's own builder; return name -> .so."""
    built: dict[str, Path] = {}
    for name, call in JIT_MODULES.items():
        code = (
            "from flashinfer.jit.comm import gen_moe_alltoall_module, gen_comm_alltoall_module\n"
            f"spec = {call}\nassert spec.name == {name!r}, spec.name\nspec.build(verbose=False)\n"
            "print(spec.jit_library_path)\n"
        )
        log(f"building {name} for sm_{arch.replace('.', '')} (minutes on few cores)")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"[stage_flashinfer] building {name} failed:\n{done.stderr[-4000:]}")
        built[name] = Path(done.stdout.strip().splitlines()[-1])
    return built


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=".flashinfer", help="output folder (ignored by git); PYTHONPATH=<out>/site")
    ap.add_argument("--wheel-dir", default=str(CACHE), help="where the wheels are, or are downloaded to")
    ap.add_argument("--arch", default="9.0a", help="CUDA arch of the GPUs that will run it (9.0a: H100/H200)")
    ap.add_argument(
        "--python-version", default="3.12", help="Python of the machine that will run it (tvm-ffi is compiled)"
    )
    ap.add_argument("--cublas-include", help="folder holding cublasLt.h")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    wheels = Path(args.wheel_dir)
    fi_wheel = pip_download(
        f"flashinfer-python=={FLASHINFER_VERSION}", wheels, python_version=None, binary_platforms=False
    )
    tvm_target = pip_download(
        f"apache-tvm-ffi=={TVM_FFI_VERSION}", wheels, python_version=args.python_version, binary_platforms=True
    )
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    tvm_here = pip_download(f"apache-tvm-ffi=={TVM_FFI_VERSION}", wheels, python_version=here, binary_platforms=True)

    # A fixed scratch tree, extracted once per wheel: ninja then rebuilds nothing on a rerun.
    scratch = CACHE.parent / f"flashinfer-scratch-{FLASHINFER_VERSION}"
    site = scratch / "site"
    if not (scratch / "EXTRACTED").is_file():
        shutil.rmtree(scratch, ignore_errors=True)
        with zipfile.ZipFile(fi_wheel) as zf:
            zf.extractall(site, [n for n in zf.namelist() if n.startswith("flashinfer/")])
        for rel, text in MINIMAL_INITS.items():
            (site / rel).write_text(text)
        # What importing flashinfer.jit needs here to build (already on the GPU image).
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(scratch / "deps"),
                str(tvm_here),
                "requests",
                "numpy",
                "cuda-bindings",
            ],
            check=True,
        )
        (scratch / "EXTRACTED").write_text(fi_wheel.name)
    env = scratch_env(scratch, args.arch, cublas_include(args.cublas_include), args.jobs)
    built = build_aot(env, args.arch)

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    dest = out / "site"
    files = import_closure(env, site)
    for path in files:
        target = dest / path.relative_to(site)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for name, so in built.items():
        target = dest / "flashinfer" / "data" / "aot" / name / f"{name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, target)
    with zipfile.ZipFile(tvm_target) as zf:
        zf.extractall(dest)
    (out / "STAGED").write_text(
        f"flashinfer-python {FLASHINFER_VERSION} (trimmed: {len(files)} modules), apache-tvm-ffi {TVM_FFI_VERSION} "
        f"for Python {args.python_version}, AOT modules {', '.join(built)} for arch {args.arch}\n"
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"staged {len(files)} modules + {len(built)} AOT modules into {out}/site: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

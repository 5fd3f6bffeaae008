#!/usr/bin/env python3
"""Stage NCCL EP (nccl-extensions) and DeepEP V2's source with an NCCL >= 2.30, small enough to carry.

Both libraries need NCCL >= 2.30 (its device API: LSA and GIN); torch's wheels pin an older one
(torch 2.11: 2.28.9). This script writes OUT (default `.ncclep/`, git-ignored; nothing of either
library is committed):

    python scripts/stage_nccl_ep.py --deepep-source ~/src/DeepEP --fmt-source ~/src/fmt
    python scripts/stage_nccl_ep.py --pack           # also OUT.tar.xz (what a GPU machine is given)
    python scripts/stage_nccl_ep.py --build-deepep   # on the GPU machine: builds deep_ep._C

  OUT/site/nvidia/nccl/  NCCL (`nvidia-nccl-cu13`, default 2.32.6) with its headers; the library's
                         device code is pruned to --arch: the wheel's libnccl.so.2 is 199 MB of which
                         191 MB are cubins for 8 GPU families, so the cubin payloads of the other
                         families are zeroed in place (every offset, header and the host code stay
                         byte-identical; the driver never reads an entry for another family), and
                         the packed file is small. STAGED records both sha256 sums.
  OUT/site/nccl/         nccl4py (`nccl.core`) and nccl-extensions' `nccl.ep`, installed --no-deps
                         (its [cu13] extra pins NCCL 2.30.7, which the index does not serve), with
                         cuda-core 1.x; the m2n libraries and the CUDA 12 builds are left out.
  OUT/deepep-src/        DeepEP V2's tree (`ElasticBuffer`) with fmt's headers, built on the GPU
                         machine by --build-deepep into OUT/site/deep_ep (its kernels are JIT).

Use: `LD_PRELOAD=OUT/site/nvidia/nccl/lib/libnccl.so.2 PYTHONPATH=OUT/site` so that torch, NCCL EP
and DeepEP V2 share the one newer NCCL (docs/backends.md says why two cannot). Needs pip here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

NCCL_VERSION = "2.32.6"
# nccl4py needs cuda-core 1.x (its `cuda.core` API), newer than some images carry.
WHEELS = {
    "nvidia-nccl-cu13": NCCL_VERSION,
    "nccl-extensions": "0.1.0",
    "nccl4py": "0.6.0",
    "cuda-core": "1.2.2",
    "cuda-pathfinder": "1.9.1",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64")
FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "a2a-tune" / "wheels"
# What the staged packages leave out: m2n (not EP) and the CUDA 12 builds.
SKIP = ("nccl/m2n/lib/", "/cu12/")


def log(msg: str) -> None:
    print(f"[stage_nccl_ep] {msg}", flush=True)


def fail(msg: str) -> None:
    sys.exit(f"[stage_nccl_ep] error: {msg}")


def wheel(name: str, version: str, python_version: str) -> Path:
    """The wheel of name==version for CPython `python_version` on x86-64, from the cache or pip."""
    stem = name.replace("-", "_")
    found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(CACHE)]
    cmd += ["--python-version", python_version, "--implementation", "cp"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    log(f"downloading {name}=={version}")
    subprocess.run([*cmd, f"{name}=={version}"], check=True)
    found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    if not found:
        fail(f"pip saved no wheel for {name}=={version}")
    return found[0]


def sections(elf: bytes | bytearray) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of an ELF64 little-endian file's sections."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for name_off, _type, _flags, _addr, off, size in heads:
        end = elf.index(b"\0", strtab + name_off)
        out[elf[strtab + name_off : end].decode()] = (off, size)
    return out


def prune_fatbins(lib: bytearray, keep_arch: int) -> dict[str, dict[str, int]]:
    """Zero, in place, the payload of every fatbin entry (cubin or PTX) not for sm_`keep_arch`.

    A fatbin: a 16-byte header (magic, version, header size, size of its entries), then entries,
    each a header (kind, header size, payload size, ..., arch at +28) and its payload. The walk
    must cover each section exactly, else nothing is changed (ValueError)."""
    stats: dict[str, dict[str, int]] = {}
    edits = []
    for name, (off, size) in sections(lib).items():
        if name not in FATBIN_SECTIONS:
            continue
        pos, end = off, off + size
        kept = zeroed = 0
        while pos < end:
            magic, _ver, head, body = struct.unpack_from("<IHHQ", lib, pos)
            if magic != FATBIN_MAGIC:
                if lib[pos : pos + 8] == b"\0" * 8 and pos + 8 <= end:  # alignment between fatbins
                    pos += 8
                    continue
                raise ValueError(f"{name}: no fatbin header at +{pos - off:#x}")
            entry, stop = pos + head, pos + head + body
            if stop > end:
                raise ValueError(f"{name}: a fatbin at +{pos - off:#x} runs past the section")
            while entry < stop:
                _kind, _unk, ehead, payload = struct.unpack_from("<HHIQ", lib, entry)
                arch = struct.unpack_from("<I", lib, entry + 28)[0]
                start = entry + ehead
                if ehead < 32 or start + payload > stop:
                    raise ValueError(f"{name}: an entry at +{entry - off:#x} runs past its fatbin")
                if arch == keep_arch:
                    kept += payload
                else:
                    edits.append((start, payload))
                    zeroed += payload
                entry = start + payload
            if entry != stop:
                raise ValueError(f"{name}: entries overrun their fatbin at +{pos - off:#x}")
            pos = stop
        stats[name] = {"kept_bytes": kept, "zeroed_bytes": zeroed}
    if not stats:
        raise ValueError("no fatbin sections found")
    for start, n in edits:
        lib[start : start + n] = bytes(n)
    return stats


def extract(whl: Path, dest: Path, keep) -> None:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.is_dir() or not keep(info.filename):
                continue
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if (info.external_attr >> 16) & 0o111:
                target.chmod(0o755)


def stage(out: Path, arch: str, python_version: str) -> dict:
    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    wheels = {n: wheel(n, v, python_version) for n, v in WHEELS.items()}
    extract(wheels["nvidia-nccl-cu13"], site, lambda f: "libnccl_device" not in f)
    for name in ("nccl4py", "nccl-extensions", "cuda-core", "cuda-pathfinder"):
        extract(wheels[name], site, lambda f: not any(s in f for s in SKIP))
    lib_path = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib = bytearray(lib_path.read_bytes())
    original = hashlib.sha256(lib).hexdigest()
    major, minor = (int(v) for v in arch.split(".")[:2])
    stats = prune_fatbins(lib, major * 10 + minor)
    lib_path.write_bytes(lib)
    staged = {
        "wheels": {n: w.name for n, w in wheels.items()},
        "nccl": NCCL_VERSION,
        "arch": f"sm_{major}{minor}",
        "libnccl_sha256_wheel": original,
        "libnccl_sha256_pruned": hashlib.sha256(lib).hexdigest(),
        "libnccl_fatbins": stats,
        "python": python_version,
    }
    log(f"libnccl.so.2: kept {sum(s['kept_bytes'] for s in stats.values()) / 1e6:.1f} MB of sm_{major}{minor} code")
    return staged


def copy_deepep(out: Path, source: Path, fmt: Path | None) -> dict:
    """DeepEP V2's tree (ElasticBuffer) with fmt's headers under third-party/fmt."""
    elastic = source / "deep_ep" / "buffers" / "elastic.py"
    if not elastic.is_file() or "class ElasticBuffer" not in elastic.read_text(errors="replace"):
        fail(f"{source} has not DeepEP V2's API (deep_ep/buffers/elastic.py with ElasticBuffer)")
    dest = out / "deepep-src"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git", "build", "*.so", "figures", "tests"))
    fmt_include = dest / "third-party" / "fmt" / "include"
    if not (fmt_include / "fmt").is_dir():
        if fmt is None or not (fmt / "include" / "fmt").is_dir():
            fail("DeepEP's third-party/fmt is empty (a submodule): pass --fmt-source with fmt's tree")
        shutil.rmtree(dest / "third-party" / "fmt", ignore_errors=True)
        shutil.copytree(fmt / "include", fmt_include)
    return {"deepep_source": str(source), "deepep_revision": _revision(source)}


def _revision(src: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def build_deepep(out: Path, jobs: int) -> None:
    """Build DeepEP V2's extension (deep_ep._C) on the GPU machine, against OUT's NCCL."""
    src, site = (out / "deepep-src").resolve(), (out / "site").resolve()  # setup.py runs in src
    nccl = (site / "nvidia" / "nccl").resolve()
    env = dict(os.environ, EP_NCCL_ROOT_DIR=str(nccl), TORCH_CUDA_ARCH_LIST=os.environ.get("ARCH", "9.0"))
    env["MAX_JOBS"] = str(jobs)
    lib = src / "build-lib"
    cmd = [sys.executable, "setup.py", "build_ext", "--build-lib", str(lib), "--build-temp", str(src / "build-tmp")]
    done = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
        fail(f"DeepEP V2's build failed (exit {done.returncode})")
    shutil.rmtree(site / "deep_ep", ignore_errors=True)
    shutil.copytree(src / "deep_ep", site / "deep_ep", ignore=shutil.ignore_patterns("__pycache__"))
    built = sorted(lib.glob("deep_ep/_C*.so"))
    if not built:
        fail(f"the build wrote no deep_ep/_C*.so into {lib}")
    shutil.copy2(built[0], site / "deep_ep" / built[0].name)
    (site / "deep_ep" / "envs.py").write_text(f"persistent_envs = {{'EP_NCCL_ROOT_DIR': {str(nccl)!r}}}\n")
    log(f"built deep_ep._C into {site / 'deep_ep'}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--out", type=Path, default=Path(".ncclep"), help="output folder (git-ignored)")
    ap.add_argument("--arch", default="9.0", help="GPU family whose NCCL code is kept (9.0: H100/H200)")
    ap.add_argument("--python-version", default="3.12", help="the CPython that will import it")
    ap.add_argument("--deepep-source", type=Path, help="a DeepEP V2 tree (deepseek-ai/DeepEP)")
    ap.add_argument("--fmt-source", type=Path, help="fmt's tree, when DeepEP's third-party/fmt submodule is empty")
    ap.add_argument("--pack", action="store_true", help="also write OUT.tar.xz of the staged folder")
    ap.add_argument("--build-deepep", action="store_true", help="only build DeepEP V2 in OUT (on the GPU machine)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs of --build-deepep")
    args = ap.parse_args()
    if args.build_deepep:
        build_deepep(args.out, args.jobs)
        return
    staged = stage(args.out, args.arch, args.python_version)
    if args.deepep_source:
        staged.update(copy_deepep(args.out, args.deepep_source, args.fmt_source))
    (args.out / "STAGED").write_text(json.dumps(staged, indent=1) + "\n")
    if args.pack:
        packed = args.out.with_name(args.out.name + ".tar.xz")
        with tarfile.open(packed, "w:xz", preset=6) as tar:
            tar.add(args.out, arcname=".")
        log(f"packed {packed}: {packed.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

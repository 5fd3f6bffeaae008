"""What the serving engines accept, and how to tell them: the data behind ``--format``.

Standard library only (imported by the runtime lookup). Literals are data, checked by
hand against each engine's source; a profile may name any literal, but lookup lets a
backend compete for an engine only when its literal is listed here, so ``--format
vllm`` can never print a value the engine would reject.

* vLLM ``--all2all-backend``: the ``All2AllBackend`` literal of ``vllm/config/parallel.py``
  (vllm-project/vllm main at commit 00193b82b0e2, after v0.14.0). Left out although the
  literal still lists them: ``naive`` and ``pplx`` (removed; vLLM replaces them with
  ``allgather_reducescatter`` and warns) and ``flashinfer_all2allv`` (a temporary alias of
  ``flashinfer_nvlink_two_sided``). That version reads no environment variable for the
  backend: ``VLLM_ALL2ALL_BACKEND`` was deprecated for removal in v0.15.0 and is gone, so
  ``--format env`` prints a2a-tune's own variables (see :func:`env_lines`).
* SGLang ``--moe-a2a-backend``: ``MOE_A2A_BACKEND_CHOICES`` of
  ``python/sglang/srt/server_args.py`` (sgl-project/sglang, 2025 releases). Newer trees add
  ``nixl`` and ``megamoe``; they are left out until a table needs them. ``none`` is
  SGLang's default: no all2all kernel (MoE via all-reduce).
"""

from __future__ import annotations

__all__ = ["ACCEPTED", "DEFAULT", "ENGINES", "accepts", "engine_flag", "env_lines"]

#: engine -> literals its all2all option accepts (see the module docstring for versions).
ACCEPTED = {
    "vllm": frozenset(
        {
            "allgather_reducescatter",
            "deepep_high_throughput",
            "deepep_low_latency",
            "deepep_v2",
            "mori_high_throughput",
            "mori_low_latency",
            "nixl_ep",
            "flashinfer_nvlink_two_sided",
            "flashinfer_nvlink_one_sided",
        }
    ),
    "sglang": frozenset({"none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer"}),
}

#: engine -> its own default, printed whenever the table cannot answer for that engine.
DEFAULT = {"vllm": "allgather_reducescatter", "sglang": "none"}

#: engine -> its command-line option.
FLAG = {"vllm": "--all2all-backend", "sglang": "--moe-a2a-backend"}

ENGINES = tuple(ACCEPTED)


def accepts(engine: str, literal) -> bool:
    """True when ``engine`` accepts ``literal`` for its all2all option."""
    return isinstance(literal, str) and literal in ACCEPTED.get(engine, ())


def engine_flag(engine: str, literal) -> str:
    """``--all2all-backend X`` / ``--moe-a2a-backend X``; the engine default if X is not accepted."""
    value = literal if accepts(engine, literal) else DEFAULT[engine]
    return f"{FLAG[engine]} {value}"


def env_lines(backend: str, vllm_literal, sglang_literal, match: str) -> list:
    """Shell lines for ``eval "$(a2a-tune lookup ... --format env)"``.

    Neither engine reads an environment variable for its all2all backend (see the module
    docstring), so these are a2a-tune's own names, for launch scripts:
    ``vllm serve ... --all2all-backend "$A2A_TUNE_VLLM_ALL2ALL_BACKEND"``.
    """
    import shlex  # only the CLI needs it; keeps the lookup's import lean

    values = {
        "A2A_TUNE_BACKEND": backend,
        "A2A_TUNE_VLLM_ALL2ALL_BACKEND": vllm_literal if accepts("vllm", vllm_literal) else DEFAULT["vllm"],
        "A2A_TUNE_SGLANG_MOE_A2A_BACKEND": sglang_literal if accepts("sglang", sglang_literal) else DEFAULT["sglang"],
        "A2A_TUNE_MATCH": match,
    }
    return [f"export {k}={shlex.quote(str(v))}" for k, v in values.items()]

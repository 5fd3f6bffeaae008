"""What each engine accepts and how to tell it (runtime/engines.py): the literal sets, the
options a literal may need, TensorRT-LLM's rule for uneven experts, and the lines ``--format``
prints. (Checked against the real vLLM and SGLang packages: test_engines_real.py.)"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from a2a_tune.tuner.runtime import engines


def test_engine_literal_table():
    assert engines.accepts("vllm", "allgather_reducescatter") and engines.accepts("vllm", "flashinfer_nvlink_one_sided")
    for bogus in ("pplx", "naive", "flashinfer_all2allv", None, "", "deepep"):
        assert not engines.accepts("vllm", bogus)
    assert engines.accepts("vllm", "moonep") and not engines.accepts("vllm", "passthrough")  # vLLM binds that itself
    assert engines.accepts("sglang", "deepep") and not engines.accepts("sglang", "deepep_low_latency")
    assert engines.accepts("sglang", "deepep", ("--deepep-mode", "low_latency"))
    assert not engines.accepts("sglang", "deepep", ("--deepep-mode",))
    assert not engines.accepts("sglang", "deepep", ("--moe-runner-backend", "triton"))  # not an option we know
    assert engines.accepts("trtllm", "DEEPEPLOWLATENCY") and not engines.accepts("trtllm", "deepep_low_latency")
    assert engines.accepts("trtllm", "DEEPEP", num_experts=256, ep_size=8)
    assert not engines.accepts("trtllm", "DEEPEP", num_experts=257, ep_size=8)
    assert engines.accepts("trtllm", "ALLGATHER", num_experts=257, ep_size=8)
    assert engines.engine_flag("vllm", "pplx") == "--all2all-backend allgather_reducescatter"
    assert engines.engine_flag("sglang", None) == "--moe-a2a-backend none"
    assert engines.engine_flag("sglang", "deepep", ("--deepep-mode", "normal")) == (
        "--moe-a2a-backend deepep --deepep-mode normal"
    )
    assert engines.engine_flag("trtllm", "NVLINK_ONE_SIDED") == "TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED"
    assert engines.engine_flag("trtllm", None) == ""  # TensorRT-LLM keeps its own choice
    assert engines.env_lines("x y", "exact", {"sglang": ("deepep", ())})[0] == "export A2A_TUNE_BACKEND='x y'"
    assert set(engines.VERSIONS) == set(engines.ENGINES) == set(engines.DEFAULT)


def test_every_engine_has_a_name_a_default_a_flag_and_a_version():
    assert (
        set(engines.NAMES)
        == set(engines.DEFAULT)
        == set(engines.FLAG)
        == set(engines.VERSIONS)
        == set(engines.ENV_VARS)
        == set(engines.ENGINES)
    )
    for engine, default in engines.DEFAULT.items():
        assert default is None or engines.accepts(engine, default)  # a default the engine takes
    assert not engines.VLLM_INTERNAL & engines.ACCEPTED["vllm"]  # what vLLM sets itself, a user cannot


@pytest.mark.parametrize(
    "options, ok",
    [
        ((), True),
        (("--deepep-mode", "auto"), True),
        (("--deepep-mode", "normal", "--deepep-mode", "low_latency"), True),
        (("--deepep-mode",), False),  # an option without its value
        (("--deepep-mode", "turbo"), False),  # a value SGLang does not take
        (("--deepep-mode", 1), False),
        (("--tp", "8"), False),  # an option the engine does not take with a backend
    ],
)
def test_an_engines_options_are_part_of_what_it_accepts(options, ok):
    assert engines.accepts("sglang", "deepep", options) is ok
    assert engines.accepts("vllm", "deepep_low_latency", options) is (options == ())  # vLLM takes none


@pytest.mark.parametrize("literal", [None, "", 7, "DeepEP", " deepep"])
def test_anything_but_an_exact_literal_is_refused(literal):
    assert not any(engines.accepts(e, literal) for e in engines.ENGINES)


def test_an_unaccepted_literal_prints_the_engines_default():
    assert engines.engine_flag("vllm", "nvlink_one_sided") == "--all2all-backend allgather_reducescatter"
    assert engines.engine_flag("sglang", "deepep", ("--deepep-mode", "turbo")) == "--moe-a2a-backend none"
    assert engines.engine_flag("trtllm", "ALLGATHER") == "TRTLLM_FORCE_COMM_METHOD=ALLGATHER"
    assert engines.engine_flag("trtllm", "allgather") == ""


def test_env_lines_are_shell_safe_and_name_tensorrt_llm_only_with_a_method():
    lines = engines.env_lines(
        "we'ird $(x)",
        "exact",
        {"vllm": ("deepep_low_latency", ()), "sglang": ("deepep", ("--deepep-mode", "normal")), "trtllm": (None, ())},
    )
    assert lines == [
        "export A2A_TUNE_BACKEND='we'\"'\"'ird $(x)'",
        "export A2A_TUNE_VLLM_ALL2ALL_BACKEND=deepep_low_latency",
        "export A2A_TUNE_SGLANG_MOE_A2A_BACKEND=deepep",
        "export A2A_TUNE_SGLANG_ARGS='--moe-a2a-backend deepep --deepep-mode normal'",
        "export A2A_TUNE_MATCH=exact",
    ]
    out = subprocess.run(
        ["sh", "-c", "\n".join(lines) + '\nprintf %s "$A2A_TUNE_BACKEND"'], capture_output=True, text=True
    ).stdout
    assert out == "we'ird $(x)"  # the value, never run
    with_trtllm = engines.env_lines("x", "exact", {"vllm": ("bogus", ()), "trtllm": ("NCCL_EP", ())})
    assert with_trtllm[1] == "export A2A_TUNE_VLLM_ALL2ALL_BACKEND=allgather_reducescatter"  # vLLM's default
    assert with_trtllm[-1] == "export TRTLLM_FORCE_COMM_METHOD=NCCL_EP"
    assert shlex.split(with_trtllm[3]) == ["export", "A2A_TUNE_SGLANG_ARGS=--moe-a2a-backend none"]


def test_engine_rules_are_data_with_their_sources():
    """Each rule names literals its engine accepts, the version read, and at least one cited
    function with its condition; each evaluated rule has its test (engine_rules._APPLIES)."""
    from a2a_tune.tuner.runtime import engine_rules as er

    assert {r.engine for r in er.RULES} == set(engines.ENGINES)
    for r in er.RULES:
        assert r.backends and r.backends <= engines.ACCEPTED[r.engine], r.name
        assert r.version == engines.VERSIONS[r.engine] and r.cites and all(c.needle for c in r.cites)
        assert r.kind in ("refuses", "states")
        if r.kind == "refuses" and r.name != "package":
            assert (r.engine, r.name) in er._APPLIES, r.name
    none = er.Deployment()
    assert all(
        er.refused(e, lit, none) is None for e in engines.ENGINES for lit in engines.ACCEPTED[e] if e != "trtllm"
    )
    lora = er.refused("vllm", "flashinfer_nvlink_one_sided", er.Deployment(lora=True))
    assert lora.name == "lora_ep" and er.refused("vllm", "allgather_reducescatter", er.Deployment(lora=True)) is None
    l4 = er.Deployment(platform="cuda:8.9", quantization="none")
    assert er.refused("vllm", "flashinfer_nvlink_two_sided", l4).name == "no_expert_kernel"
    assert er.refused("vllm", "deepep_low_latency", l4) is None
    assert (
        er.refused("vllm", "flashinfer_nvlink_one_sided", er.Deployment(platform="cuda:10.0", quantization="none"))
        is None
    )
    assert er.nearest_version("vllm", "0.34.1")[1] == "vLLM 0.34.1: rules read from 0.33.0, the nearest known"
    assert all(len(er.describe_line(d)) < 600 for d in er.describe())

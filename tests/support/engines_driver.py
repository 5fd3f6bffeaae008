"""Runs inside the real engines' environment (.ci/engines.sh), driven by tests/test_engines_real.py.

``python engines_driver.py vllm SCENARIOS.json``: for each scenario ({"name", "argv", "env"}),
what ``vllm serve <argv>`` does up to its engine config, in this one process (vLLM is
imported once): vLLM's serve parser, ``AsyncEngineArgs.from_cli_args``, plugin loading (the
a2a-tune entry point) and ``create_engine_config``. Prints one JSON line per scenario: the
backend in the built config, how many times vLLM built it, the records a2a-tune logged, and
the config values the lookup depends on. Then one line about vLLM's parser itself: the
``--all2all-backend`` choices, the whole ``All2AllBackend`` literal, and which spellings of
the option the parser takes.

A scenario may carry ``"emulate"``: ``{"platform": "cuda:9.0"}`` (what the plugin reads as vLLM's
platform) and ``{"packages": "all"}`` (every backend's package importable), for the vLLM
built on its CPU platform here.

``python engines_driver.py failures SPEC.json``: the four start-up failures of vLLM PR 53952's
revert, each with vLLM's own code under the platform it needs (emulated around that code):
forcing ``flashinfer_nvlink_one_sided`` fails with vLLM's message, and the backend the
plugin's :func:`decide` answers passes the same check. One JSON line per case.

Only the standard library besides the engines; never imported by the test process.

Design notes: docs/architecture.md, "Module notes", `tests/support/engines_driver.py`.
"""

from __future__ import annotations

import json
import logging
import os
import sys

MARK = "A2A_DRIVER "
#: Spellings of ``--all2all-backend`` tried on vLLM's parser (each followed by a value).
SPELLINGS = (
    "--all2all-backend",
    "--all2all_backend",
    "--all2all-backen",
    "--all2all",
    "--all2a",
    "--all2",
    "--all",
    "--al",
    "--all2all-backends",
)


def emit(obj) -> None:
    print(MARK + json.dumps(obj), flush=True)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append([record.levelname, record.getMessage()])


def _action(parser, option: str):
    """The argparse action of ``option`` in ``parser`` or any of its subparsers."""
    import argparse

    for action in parser._actions:
        if option in action.option_strings:
            return action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found = _action(sub, option)
                if found is not None:
                    return found
    return None


def run_vllm(scenarios: list) -> None:
    from typing import get_args

    import vllm.entrypoints.cli.serve as serve
    from vllm.config.parallel import All2AllBackend
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from a2a_tune.tuner.runtime.lookup import clear_cache

    builds = [0]
    original = EngineArgs.create_engine_config

    def counted(self, *args, **kwargs):  # installed before the plugin wraps it: counts vLLM's builds
        builds[0] += 1
        return original(self, *args, **kwargs)

    EngineArgs.create_engine_config = counted
    records = Records()

    def attach():
        for name in ("vllm.a2a_tune", "a2a_tune"):
            logging.getLogger(name).addHandler(records)

    # vLLM configures logging inside create_engine_config (dictConfig resets the handlers of
    # the "vllm" loggers' children): re-attach the recorder after each configuration.
    import vllm.logger

    configure = vllm.logger.dictConfig

    def dict_config(cfg):
        configure(cfg)
        attach()

    vllm.logger.dictConfig = dict_config
    attach()

    def parser():
        p = FlexibleArgumentParser(prog="vllm")
        serve.ServeSubcommand().subparser_init(p.add_subparsers(required=True, dest="subparser"))
        return p

    from a2a_tune.tuner.runtime import vllm_plugin

    real_platform, real_missing = vllm_plugin._platform_of, vllm_plugin._missing_packages
    base_env = dict(os.environ)
    for sc in scenarios:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(sc.get("env", {}))
        emulate = sc.get("emulate", {})
        platform = emulate.get("platform")
        vllm_plugin._platform_of = (lambda p=platform: p) if platform else real_platform
        vllm_plugin._missing_packages = (lambda: []) if emulate.get("packages") == "all" else real_missing
        sys.argv = ["vllm", "serve", *sc["argv"]]
        clear_cache()  # a fresh engine process each time
        builds[0] = 0
        records.records = []
        out = {"name": sc["name"]}
        try:
            args = parser().parse_args(sys.argv[1:])
            args.model = args.model_tag
            config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER
            )
            par, sched, model = config.parallel_config, config.scheduler_config, config.model_config
            kv = config.kv_transfer_config
            out.update(
                all2all_backend=par.all2all_backend,
                data_parallel_size=par.data_parallel_size,
                tensor_parallel_size=par.tensor_parallel_size,
                prefill_context_parallel_size=par.prefill_context_parallel_size,
                enable_expert_parallel=par.enable_expert_parallel,
                max_num_seqs=sched.max_num_seqs,
                max_num_batched_tokens=sched.max_num_batched_tokens,
                kv_role=getattr(kv, "kv_role", None),
                dtype=str(model.dtype),
                quantization=model.quantization,
            )
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["builds"] = builds[0]
        out["records"] = list(records.records)
        emit(out)

    # vLLM's parser itself.
    action = _action(parser(), "--all2all-backend")
    spellings = {}
    for spelling in SPELLINGS:
        try:
            ns = parser().parse_args(["serve", "m", spelling, "deepep_low_latency"])
            spellings[spelling] = getattr(ns, "all2all_backend", None) == "deepep_low_latency"
        except SystemExit:
            spellings[spelling] = False
    emit(
        {
            "name": "parser",
            "choices": sorted(action.choices),
            "literal": sorted(get_args(All2AllBackend)),
            "spellings": spellings,
        }
    )


def run_sglang(arg_lists: list) -> None:
    import argparse

    from sglang.srt.server_args import ServerArgs

    def parser():
        p = argparse.ArgumentParser(prog="sglang")
        ServerArgs.add_cli_args(p)
        p.exit_on_error = False
        return p

    p = parser()
    parsed = []
    for args in arg_lists:
        try:
            ns = p.parse_args(["--model-path", "m", *args])
            parsed.append({"moe_a2a_backend": ns.moe_a2a_backend, "deepep_mode": ns.deepep_mode})
        except (SystemExit, argparse.ArgumentError) as exc:
            parsed.append({"error": str(exc)})
    emit(
        {
            "name": "sglang",
            "moe_a2a_backend": sorted(_action(p, "--moe-a2a-backend").choices),
            "moe_a2a_backend_default": _action(p, "--moe-a2a-backend").default,
            "deepep_mode": sorted(_action(p, "--deepep-mode").choices),
            "parsed": parsed,
        }
    )


class _Group:
    """A one-rank process group: what vLLM's all2all managers use of one."""

    world_size, rank_in_group = 1, 0

    def all_gatherv(self, tensors, dim=0, sizes=None):
        return list(tensors)


def _emulate_platform(kind: str, capability=None) -> None:
    """vLLM's current platform object answers as ``kind`` ("cuda", "rocm") with ``capability``."""
    from vllm.platforms import PlatformEnum, current_platform
    from vllm.platforms.interface import DeviceCapability

    current_platform._enum = PlatformEnum.CUDA if kind == "cuda" else PlatformEnum.ROCM
    if capability:
        current_platform.get_device_capability = lambda device_id=0: DeviceCapability(*capability)


def _error(call, *args) -> str | None:
    """None when ``call(*args)`` passes; else the exception as "Type: message (raised in file:function)"."""
    import traceback

    try:
        call(*args)
    except Exception as exc:  # noqa: BLE001 - vLLM's own refusal, reported to the test
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename.split('site-packages/')[-1]}:{frame.name}"
        return f"{type(exc).__name__}: {exc} (raised in {where})"
    return None


def run_failures(spec: dict) -> None:
    from types import SimpleNamespace

    import torch
    import vllm.entrypoints.cli.serve as serve
    from vllm.distributed.device_communicators import all2all
    from vllm.distributed.device_communicators.base_device_communicator import All2AllManagerBase
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
    from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import select_unquantized_moe_backend
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from a2a_tune.tuner.runtime import vllm_plugin
    from a2a_tune.tuner.runtime.lookup import clear_cache, lookup

    os.environ.update(spec["env"])
    os.environ["A2A_TUNE_VLLM_PLUGIN"] = "0"  # vLLM builds its own config; decide() is asked below

    def config(extra):
        p = FlexibleArgumentParser(prog="vllm")
        serve.ServeSubcommand().subparser_init(p.add_subparsers(required=True, dest="subparser"))
        args = p.parse_args(["serve", *spec["argv"], *extra])
        args.model = args.model_tag
        return AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)

    def parallel(backend):  # what FusedMoEParallelConfig.make builds for DP 2 x EP 2 on rank 0
        return FusedMoEParallelConfig(
            tp_size=1,
            pcp_size=1,
            dp_size=2,
            ep_size=2,
            tp_rank=0,
            pcp_rank=0,
            dp_rank=0,
            ep_rank=0,
            sp_size=1,
            use_ep=True,
            all2all_backend=backend,
            enable_eplb=False,
        )

    def oracle(backend):  # the unquantized MoE oracle, as UnquantizedFusedMoEMethod.__init__ asks it
        moe = FusedMoEConfig(
            num_experts=256,
            experts_per_token=8,
            hidden_dim=7168,
            intermediate_size=2048,
            num_local_experts=128,
            num_logical_experts=256,
            activation=MoEActivation.SILU,
            device="cuda",
            routing_method=RoutingMethodType.DeepSeekV3,
            moe_parallel_config=parallel(backend),
            in_dtype=torch.bfloat16,
        )
        select_unquantized_moe_backend(moe)

    def lora_check(backend):  # FusedMoEWithLoRA.__init__ -> _ep_check
        FusedMoEWithLoRA._ep_check(
            SimpleNamespace(use_ep=True, moe_config=SimpleNamespace(moe_parallel_config=parallel(backend)))
        )

    managers = {
        "flashinfer_nvlink_one_sided": all2all.FlashInferNVLinkOneSidedManager,
        "allgather_reducescatter": all2all.AgRsAll2AllManager,
    }

    def one_rank_init(self, cpu_group, tcp_store_group=None):  # All2AllManagerBase.__init__ on one rank
        self.cpu_group, self.tcp_store_group = cpu_group, tcp_store_group
        self.dp_group = self.tp_group = _Group()
        self.dp_rank, self.dp_world_size, self.rank, self.world_size, self.internode = 0, 1, 0, 1, False

    def manager(backend):  # CudaCommunicator.__init__ builds the backend's manager (ROCm uses it too)
        from vllm.config import set_current_vllm_config

        All2AllManagerBase.__init__ = one_rank_init
        with set_current_vllm_config(cfg):
            return managers[backend](None)

    def naive_dispatch(backend):  # MoERunner._maybe_dispatch for a MoE method without the modular kernel
        method = SimpleNamespace(
            supports_internal_mk=FusedMoEMethodBase.supports_internal_mk.fget(SimpleNamespace(moe_kernel=None))
        )
        runner = SimpleNamespace(
            moe_config=SimpleNamespace(dp_size=2, is_sequence_parallel=False), _quant_method=method
        )
        assert MoERunner.do_naive_dispatch_combine.fget(runner), "vLLM would not take the naive path"
        mgr = SimpleNamespace(dp_world_size=1, _get_comm_group=lambda sp: _Group())
        mgr._get_sizes = lambda n, group: managers["allgather_reducescatter"]._get_sizes(mgr, n, group)
        managers[backend].dispatch_router_logits(mgr, torch.zeros(4, 7168), torch.zeros(4, 256))

    # name: (vllm serve arguments, platform, vLLM's check, quantization_config, the rules' facts)
    cases = {
        "sm89_unquantized": ([], ("cuda", (8, 9)), oracle, {}, {"quantization": "none"}),
        "lora_with_ep": (["--enable-lora"], ("cuda", (9, 0)), lora_check, {}, {"lora": True}),
        "rocm": ([], ("rocm", None), manager, {}, {}),
        "naive_dispatch": (
            [],
            ("cuda", (9, 0)),
            naive_dispatch,
            {"quant_method": "quark"},
            {"quantization": "quark_w4a8_fp8"},
        ),
    }
    cfg = None
    for name, (extra, (kind, capability), check, quant, facts) in cases.items():
        out = {"name": name}
        try:
            cfg = config(extra)
            _emulate_platform(kind, capability)
            if quant:  # the checkpoint's quantization_config, as vLLM reads it from config.json
                cfg.model_config.hf_config.quantization_config = quant
            vllm_plugin._missing_packages = lambda: []  # every backend's package importable: the rules decide
            clear_cache()
            decision = vllm_plugin.decide(cfg)
            answer = decision.literal or cfg.parallel_config.all2all_backend
            # lookup with the deployment's facts (the rules' answer; the plugin's where it can read them)
            asked = dict(ep_size=2, hidden=7168, topk=8, num_experts=256, phase="decode", max_tokens=64)
            rules = lookup(engine="vllm", platform=vllm_plugin._platform_of(), **asked, **facts).engines["vllm"]
            out.update(
                platform=vllm_plugin._platform_of(),
                decision=decision.message,
                answer=answer,
                rules_answer=rules,
                forced_error=_error(check, "flashinfer_nvlink_one_sided"),
                answer_error=_error(check, answer),
                rules_answer_error=_error(check, rules),
            )
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
            out["error"] = f"{type(exc).__name__}: {exc}"
        emit(out)


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        data = json.load(f)
    {"vllm": run_vllm, "sglang": run_sglang, "failures": run_failures}[sys.argv[1]](data)

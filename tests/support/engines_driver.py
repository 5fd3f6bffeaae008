"""Runs inside the real engines' environment (.ci/engines.sh), driven by tests/test_engines_real.py.

``python engines_driver.py vllm SCENARIOS.json``: for each scenario ({"name", "argv", "env"}),
what ``vllm serve <argv>`` does up to its engine config, in this one process (vLLM is
imported once): vLLM's serve parser, ``AsyncEngineArgs.from_cli_args``, plugin loading (the
a2a-tune entry point) and ``create_engine_config``. Prints one JSON line per scenario: the
backend in the built config, how many times vLLM built it, the records a2a-tune logged, and
the config values the lookup depends on. Then one line about vLLM's parser itself: the
``--all2all-backend`` choices, the whole ``All2AllBackend`` literal, and which spellings of
the option the parser takes.

``python engines_driver.py sglang ARGS.json``: SGLang's argument parser: the choices of
``--moe-a2a-backend`` and ``--deepep-mode``, and for each argument list in ARGS.json what
the parser made of it.

Only the standard library besides the engines; never imported by the test process.
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

    base_env = dict(os.environ)
    for sc in scenarios:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(sc.get("env", {}))
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


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        data = json.load(f)
    {"vllm": run_vllm, "sglang": run_sglang}[sys.argv[1]](data)

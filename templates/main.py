"""Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE).

The Flex Template launcher runs `python main.py --name=value ...` with one `--name=value` per
template parameter, BOOLEAN parameters included (`--large_model=true`). argparse `store_true` flags
reject a value, so such flags are rewritten first: `--flag=true` -> `--flag`, `--flag=false` -> dropped.
The runner defaults to Dataflow, a Dataflow launch without --sdk_container_image stops at once, and
everything else goes unchanged to `pipeline.run.main(..., wait=False)`: a Flex Template program
must return right after `run()` (Google's Flex Template guide); if the launcher has the program
write the job to a --template_location, there is not even a job id to wait on.
"""

from __future__ import annotations

import logging
import sys

TRUE = {"true", "1", "yes", "y", "on"}
FALSE = {"false", "0", "no", "n", "off"}


def boolean_flags() -> set[str]:
    """`--name` of every store_true / store_false flag of every PipelineOptions class (ours included)."""
    import argparse

    from pipeline.flags import beam_parser

    flags = set()
    for action in beam_parser()._actions:  # noqa: SLF001
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):  # noqa: SLF001
            flags.update(s for s in action.option_strings if s.startswith("--"))
    return flags


def normalize_boolean_flags(argv: list[str], flags: set[str]) -> list[str]:
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name in flags and value.strip().lower() in TRUE | FALSE:
            if value.strip().lower() in TRUE:
                out.append(name)
            continue
        out.append(arg)
    return out


def _value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def launch_args(argv: list[str]) -> list[str]:
    """This file only ever launches Dataflow jobs: default the runner to Dataflow (pipeline.run's own
    default is the local FnApiRunner) and insist on the worker image, without which the workers
    run Beam's stock image, which has neither torch nor this project."""
    if _value(argv, "--runner") is None:
        argv = ["--runner=DataflowRunner", *argv]
    if "Dataflow" in (_value(argv, "--runner") or "") and not (
            _value(argv, "--sdk_container_image") or _value(argv, "--worker_harness_container_image")):
        print("error: sdk_container_image is not set: pass --parameters sdk_container_image=IMAGE "
              "(this template's own image)", file=sys.stderr)
        raise SystemExit(2)  # exit status 2, as every other mistake that stops a job before any work
    return argv


def run(argv: list[str]) -> int:
    from pipeline.run import main

    return main(launch_args(normalize_boolean_flags(argv, boolean_flags())), wait=False)


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.INFO)
    sys.exit(run(sys.argv[1:]))

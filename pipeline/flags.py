"""Strict command lines: a mistyped, unknown or malformed flag stops the job in one line, exit 2.

Beam's own option parsing only logs what it cannot parse ("Unparseable argument: --temprature.
Did you mean '--temperature'?") and runs with the defaults, and it must stay lenient: Dataflow
workers parse options again and receive internal flags no options class declares. So the
check is the launcher's, on its own argv, before the pipeline is built; workers never run it.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser


class FlagError(ValueError):
    """A command line that must not start a job; the message is one line."""


def _suggest(arg: str, known: list[str]) -> str:
    name = arg.split("=", 1)[0]
    close = difflib.get_close_matches(name, known, n=1) if name.startswith("--") else []
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown_message(unknown: list[str], known: list[str]) -> str:
    first = next((a for a in unknown if a.startswith("-")), unknown[0])
    kind = "unknown flag" if first.startswith("-") else "unexpected argument"
    return f"{kind} {first}{_suggest(first, known)}"


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings]  # noqa: SLF001


def _unknown(parser: argparse.ArgumentParser, argv: list[str] | None) -> list[str]:
    """The arguments the parser does not know, read before it asks for a missing required flag: a
    mistyped `--target-model` is named as the typo it is, not as a missing `--target_model`. (Not
    with --help, which prints the usage as this pass would see it: every flag optional.)"""
    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        return []
    required = [a for a in parser._actions if a.required]  # noqa: SLF001
    for action in required:
        action.required = False
    try:
        return parser.parse_known_args(argv)[1]
    finally:
        for action in required:
            action.required = True


class _StrictBeamParser(_BeamArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise FlagError(message)


def beam_parser() -> _BeamArgumentParser:
    """Every flag of every PipelineOptions class, ours included, as Beam assembles them
    (PipelineOptions.get_all_options: first definition of a class wins, no abbreviations)."""
    import pipeline.options  # noqa: F401  (registers SpecDecOptions)

    parser = _StrictBeamParser(allow_abbrev=False)
    subset: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        try:
            cls._add_argparse_args(parser)  # noqa: SLF001
        except argparse.ArgumentError:
            continue  # a flag defined twice: the first definition wins, as in Beam
    return parser


def check_pipeline_flags(argv: list[str]) -> None:
    """Raise FlagError for any flag no Beam options class knows, a value that does not parse, or
    several drafts: `--draft_model` repeated, as pipeline.tune takes its candidates, ran the last
    one without a word (other flags keep argparse's rule, the last one wins)."""
    parser = beam_parser()
    if unknown := _unknown(parser, argv):
        raise FlagError(_unknown_message(unknown, _option_strings(parser)))
    parser.parse_known_args(argv)  # (now a missing required flag)
    if (n := sum(a.split("=", 1)[0] == "--draft_model" for a in argv)) > 1:
        raise FlagError(f"--draft_model is given {n} times: a job runs one draft (pipeline.tune compares several)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a count of 0 or below ran a default, or failed deep in the work: 0 or -3
    demo prompts ran 40 or 37, 0 threads raised in torch, 0 benchmark prompts divided by zero in the table)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the other entry points: one error line (no usage block), exit status 2,
    no abbreviated flags (`--max_new_token` is a typo, not a prefix), and a suggestion."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        if unknown := _unknown(self, args):
            self.error(_unknown_message(unknown, _option_strings(self)))
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)

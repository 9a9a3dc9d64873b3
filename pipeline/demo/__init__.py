"""The offline demo: `python -m pipeline.demo` (`cli`), its task (`data`), and the committed pair
(`assets`) with the recipe that made it (`recipes`; `python -m pipeline.demo.models --retrain`). docs/demo.md."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.demo` (`pipeline.demo.cli.main`); imported on call, so that
    `python -m pipeline.demo.models` does not find its module already imported."""
    from pipeline.demo.cli import main as demo_main

    return demo_main(argv)

"""Every command a user runs: the console scripts of pyproject.toml and `python -m pipeline.<job>`."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_names_a_main(name):
    module, _, func = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), func)), SCRIPTS[name]


@pytest.mark.slow
@pytest.mark.parametrize("module", ["pipeline.run", "pipeline.prepare", "pipeline.report", "pipeline.tune",
                                    "pipeline.bench", "pipeline.bench.throughput", "pipeline.demo"])
def test_python_m_entry_point_answers_help(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]

"""Every command a user runs: the console scripts of pyproject.toml and `python -m pipeline.<job>`."""

import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
MODULES = ["pipeline.run", "pipeline.prepare", "pipeline.report", "pipeline.tune", "pipeline.bench",
           "pipeline.bench.throughput", "pipeline.demo"]

# What `python -m MODULE --help` does (`runpy.run_module` as `__main__`, with sys.argv set), for
# every module in one child process: one import of torch and Beam instead of one per module, which
# took 7-9 s each on a 2-core CPU.
_HELP_ALL = """
import contextlib, io, json, runpy, sys, traceback
said = {}
for module in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [module, "--help"]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
    said[module] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-2000:]}
print(json.dumps(said))
"""


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_names_a_main(name):
    module, _, func = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), func)), SCRIPTS[name]


@pytest.fixture(scope="module")
def helps() -> dict:
    out = subprocess.run([sys.executable, "-c", _HELP_ALL, *MODULES], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES)
def test_python_m_entry_point_answers_help(module, helps):
    said = helps[module]
    assert said["code"] == 0 and "usage:" in said["stdout"], said["stderr"]

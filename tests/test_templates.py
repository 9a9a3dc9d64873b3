"""templates/: Flex Template metadata against the pipeline's real flags, Dockerfile, Makefile, main.py.

All offline: metadata.json is parsed with the Dataflow API's own proto (google-cloud-dataflow-client,
installed by apache-beam[gcp]), which rejects unknown fields and unknown paramType values.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.cloud import dataflow_v1beta3
from google.protobuf import json_format

from pipeline.options import SpecDecOptions

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"
METADATA = json.loads((TEMPLATES / "metadata.json").read_text())
PARAMS = {p["name"]: p for p in METADATA["parameters"]}
DOCKERFILE = (TEMPLATES / "Dockerfile").read_text()



def load_template_main():
    """templates/main.py (the Flex Template entry point; not a package module) as a module."""
    import importlib.util

    if "specdec_template_main" not in sys.modules:
        spec = importlib.util.spec_from_file_location("specdec_template_main", TEMPLATES / "main.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["specdec_template_main"] = module
    return sys.modules["specdec_template_main"]


template_main = load_template_main()


def _actions() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    SpecDecOptions._add_argparse_args(parser)
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


ACTIONS = _actions()


def _accepts(param: dict, value: str) -> bool:
    return all(re.fullmatch(rx, value) for rx in param.get("regexes", []))


def test_metadata_parses_as_dataflow_template_metadata():
    msg = dataflow_v1beta3.TemplateMetadata.pb()()
    json_format.ParseDict(METADATA, msg)  # raises on unknown fields / enum values
    assert msg.name and msg.description
    assert len(msg.parameters) == len(METADATA["parameters"])
    # and as the spec `gcloud dataflow flex-template build` writes
    spec = dataflow_v1beta3.ContainerSpec.pb()()
    json_format.ParseDict({"image": "us-central1-docker.pkg.dev/p/r/specdec-beam:1",
                           "sdkInfo": {"language": "PYTHON"}, "metadata": METADATA}, spec)
    assert spec.metadata.parameters[0].name == "input"


def test_metadata_rejects_what_the_service_would():
    bad = json.loads(json.dumps(METADATA))
    bad["parameters"][0]["paramType"] = "INTEGER"
    with pytest.raises(json_format.ParseError, match="INTEGER"):
        json_format.ParseDict(bad, dataflow_v1beta3.TemplateMetadata.pb()())


def test_one_parameter_per_pipeline_flag():
    names = [p["name"] for p in METADATA["parameters"]]
    assert len(names) == len(set(names)), "duplicate parameter names"
    assert set(names) == set(ACTIONS), {
        "in metadata only": sorted(set(names) - set(ACTIONS)),
        "flags missing from metadata": sorted(set(ACTIONS) - set(names)),
    }
    for p in METADATA["parameters"]:
        assert p["label"] and p["helpText"], p["name"]


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_parameter_matches_flag(name):
    param, action = PARAMS[name], ACTIONS[name]
    assert param["isOptional"] == (not action.required), name
    for rx in param.get("regexes", []):
        re.compile(rx)
    if action.choices:
        assert param["paramType"] == "ENUM"
        assert [o["value"] for o in param["enumOptions"]] == list(action.choices)
        assert all(_accepts(param, c) for c in action.choices)
        assert not _accepts(param, "not-a-choice")
    if isinstance(action, argparse._StoreTrueAction):
        assert param["paramType"] == "BOOLEAN"
        assert _accepts(param, "true") and _accepts(param, "false")
    if action.type in (int, float):
        assert param["paramType"] == "NUMBER"
    if "defaultValue" in param:
        default = param["defaultValue"]
        assert _accepts(param, default), (name, default)
        if isinstance(action, argparse._StoreTrueAction):
            assert default == str(action.default).lower()
        else:
            parsed = action.type(default) if callable(action.type) else default
            assert parsed == action.default, (name, default, action.default)
    # every value the help text gives as an example ("e.g. X") is accepted, and parses as the flag does
    for example in re.findall(r"e\.g\. ([^\s,]+[^\s.,])", param["helpText"]):
        assert _accepts(param, example), (name, example)
        if callable(action.type):
            action.type(example)


@pytest.mark.parametrize("name,value", [
    ("input", "/local/prompts.parquet"),
    ("input", "gs://Bad_Bucket/x.parquet"),
    ("output", "gs://bucket"),
    ("output", "gs://acme-data/runs/"),  # a folder: the prefix names the files (the console's folder picker gives one)
    ("output", "gs://acme-data/runs/a,b/gens"),  # (the job refuses a comma: runs are joined by commas)
    ("target_model", "gs://b/m\nx"),
    ("num_speculative_tokens", "0"),
    ("max_new_tokens", "-1"),
    ("temperature", "hot"),
    ("top_p", "1.5"),
    ("top_p", "0"),
    ("top_k", "0"),
    ("device", "tpu"),
    ("large_model", "yes"),
    ("accelerator", "nvidia-l4"),
    ("max_item_seconds", "0"),  # (the job refuses it: the form should)
    ("max_item_seconds", "0.00"),
])
def test_regexes_reject_bad_values(name, value):
    assert not _accepts(PARAMS[name], value)


@pytest.mark.parametrize("name,value", [
    ("input", "gs://acme-data/prompts/part-*.parquet"),
    ("output", "gs://acme-data/runs/2025-01-01/gens"),
    ("target_model", "gs://acme-models/llama/8b"),
    ("target_model", "meta-llama/Llama-3.1-8B-Instruct"),
    ("draft_model", "gpt2"),
    ("temperature", "0.7"),
    ("top_p", "0.95"),
    ("top_p", "1"),
    ("device", "cuda:1"),
    ("passthrough_columns", "source,category"),
    ("accelerator", "type:nvidia-l4;count:1;install-nvidia-driver"),
    ("accelerator", "type:nvidia-l4;count:1;machine_type:g2-standard-8;install-nvidia-driver"),  # (with a machine)
    ("max_item_seconds", "0.5"),
    ("max_item_seconds", "30"),
    ("system_prompt", ""),  # (an empty system message: how a template's default one is suppressed)
])
def test_regexes_accept_good_values(name, value):
    assert _accepts(PARAMS[name], value)


# --- templates/main.py ---------------------------------------------------------------------------

def test_image_builds_upload_only_what_the_dockerfile_copies():
    """`make image` uploads the checkout to Cloud Build (.gcloudignore) and `make image-local` sends
    it to docker (.dockerignore): models downloaded into it as the Dataflow page says, about 30 GB,
    went too. Both keep only the top-level paths the Dockerfile copies."""
    copied = set()
    for line in (ROOT / "templates" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            copied |= {source.split("/")[0] for source in line.split()[1:-1]}
    kept = {}
    for name, everything in ((".gcloudignore", "/*"), (".dockerignore", "*")):
        lines = [x for x in (ROOT / name).read_text().splitlines() if x and not x.startswith("#")]
        assert everything in lines, name
        kept[name] = {x.strip("!/") for x in lines if x.startswith("!")}
    assert kept[".gcloudignore"] == kept[".dockerignore"] == copied, (kept, copied)


def test_main_rewrites_boolean_parameters_for_argparse():
    flags = template_main.boolean_flags()
    assert "--large_model" in flags
    assert "--dry_run" in flags or "--save_main_session" in flags  # Beam's own store_true flags too
    argv = ["--input=gs://b/in/*.parquet", "--large_model=true", "--prompt_column=true"]
    assert template_main.normalize_boolean_flags(argv, flags) == [
        "--input=gs://b/in/*.parquet", "--large_model", "--prompt_column=true"]
    assert template_main.normalize_boolean_flags(["--large_model=False"], flags) == []
    base = ["--input=x", "--output=y", "--target_model=z"]
    for value, expected in [("true", True), ("false", False)]:
        normalized = template_main.normalize_boolean_flags([*base, f"--large_model={value}"], flags)
        assert SpecDecOptions(normalized).large_model is expected
    with pytest.raises(SystemExit):  # what the launcher's argv would do without the rewrite
        SpecDecOptions([*base, "--large_model=true"]).large_model  # noqa: B018


def test_main_runs_the_pipeline_without_waiting(monkeypatch, capsys):
    import pipeline.run

    calls = []
    monkeypatch.setattr(pipeline.run, "main", lambda argv, wait=True: calls.append((argv, wait)) or 0)
    image = "--sdk_container_image=us-docker.pkg.dev/p/r/specdec-beam:1"
    assert template_main.run(["--input=a", "--large_model=true", image]) == 0
    assert calls == [(["--runner=DataflowRunner", "--input=a", "--large_model", image], False)]
    # without the worker image a Dataflow launch stops at once, with one line
    with pytest.raises(SystemExit) as stopped:
        template_main.run(["--input=a"])
    assert stopped.value.code == 2 and "error: sdk_container_image is not set" in capsys.readouterr().err
    # a runner given explicitly is kept; local runners need no image
    template_main.run(["--runner", "FnApiRunner", "--input=a"])
    assert calls[-1] == (["--runner", "FnApiRunner", "--input=a"], False)


# --- Dockerfile ----------------------------------------------------------------------------------

def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_one_image_for_launcher_and_worker():
    ins = _instructions()
    args = {}  # ARG defaults (a bare `ARG X` after FROM re-declares X without changing its value)
    for word, rest in ins:
        if word == "ARG" and "=" in rest:
            args.setdefault(*rest.split("=", 1))
    froms = [rest for word, rest in ins if word == "FROM"]
    # the worker base is Beam's SDK image of exactly the installed Beam and Python versions
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert froms[-1] == f"apache/beam_python{py}_sdk:${{BEAM_VERSION}}"
    assert f"python{py.replace('.', '')}-template-launcher-base" in args["LAUNCHER_IMAGE"]
    copies = [rest for word, rest in ins if word == "COPY"]
    assert any("/opt/google/dataflow/python_template_launcher" in rest for rest in copies)
    # the entry point file exists in the image at the path the launcher is told
    env = " ".join(rest for word, rest in ins if word == "ENV")
    py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", env).group(1)
    assert f"templates/main.py {py_file}" in copies
    # dependencies are baked in: nothing is pip-installed when the launcher starts
    assert "FLEX_TEMPLATE_PYTHON_REQUIREMENTS_FILE" not in env
    assert "FLEX_TEMPLATE_PYTHON_SETUP_FILE" not in env
    # the final instruction keeps Beam's boot as the entry point (required for SDK containers)
    assert ins[-1] == ("ENTRYPOINT", '["/opt/apache/beam/boot"]')


def test_dockerfile_copies_the_whole_package():
    copied = set()
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for src in sources:
                assert (ROOT / src).exists() or src == "README.md", f"COPY source {src} is not in the repo"
                copied.add(src)
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"include\s*=\s*\[([^\]]*)\]", pyproject).group(1)
    for pkg in re.findall(r'"(\w+)\*?"', packages):
        assert pkg in copied, f"package {pkg} is not copied into the image"
    assert {"pyproject.toml", "README.md", "requirements.lock", "templates/main.py"} <= copied


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version and ";" not in line, f"{line}: the lock pins exact versions"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_image_installs_the_lock():
    """The image runs what the tests ran: every pip install in it is held by requirements.lock, and
    the Beam base image and CUDA torch it starts from are the lock's versions."""
    lock = _lock()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE, re.M))
    assert args["BEAM_VERSION"] == lock["apache-beam"]
    assert args["TORCH_VERSION"] == lock["torch"]
    assert not any(k.startswith("nvidia-") for k in lock), "the lock holds the CUDA build's packages"
    runs = [rest for word, rest in _instructions() if word == "RUN" and "pip install" in rest]
    for rest in runs:
        for cmd in re.split(r"&&", rest):
            if "pip install" in cmd:
                assert "-c /template/requirements.lock" in cmd or '"torch==${TORCH_VERSION}"' in cmd, cmd


def test_tests_run_with_the_lock():
    """What the tests run with is what the image installs: README's commands and CI install the lock."""
    import importlib.metadata

    differ = []
    for name, version in _lock().items():
        try:
            installed = importlib.metadata.version(name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue  # a platform-only package (the lock is for Linux x86_64)
        if installed != version:
            differ.append(f"{name} {installed} (lock {version})")
    assert not differ, "not installed from requirements.lock: " + ", ".join(differ)


def test_lock_satisfies_pyproject():
    """A pyproject.toml edited without refreshing the lock (`bash .ci/lock`) fails here."""
    import tomllib

    from packaging.requirements import Requirement

    lock = _lock()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in lock, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(lock[name], prereleases=True), f"{req.name}: lock {lock[name]} is outside {req}"


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed")
def test_hadolint():
    subprocess.run(["hadolint", str(TEMPLATES / "Dockerfile")], check=True)


# --- Makefile ------------------------------------------------------------------------------------

def make_dry_run(*args: str) -> str:
    """What `make -n` would run for the Makefile's targets and variables in `args`."""
    return subprocess.run(["make", "-s", "-n", "-f", "templates/Makefile", *args, "PROJECT=acme-ml", "RUN_ID=r1"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_makefile_run_passes_known_parameters():
    out = make_dry_run("run", "template")
    assert "gcloud dataflow flex-template run specdec-r1" in out.replace('"', "")
    assert "--metadata-file templates/metadata.json" in out
    params = re.search(r"--parameters '\^~\^([^']*)'", out).group(1)
    pairs = dict(kv.split("=", 1) for kv in params.split("~"))
    gpu = "type:nvidia-l4;count:1;install-nvidia-driver"
    assert pairs["dataflow_service_options"] == f"worker_accelerator={gpu}"
    assert pairs["output"] == "gs://acme-ml-specdec/runs/r1/gens"
    # every parameter is a template parameter or a Beam pipeline option, with a value its flag accepts
    argv = template_main.normalize_boolean_flags([f"--{k}={v}" for k, v in pairs.items()],
                                                template_main.boolean_flags())
    from apache_beam.options.pipeline_options import PipelineOptions

    known = PipelineOptions(argv).get_all_options(retain_unknown_options=False)
    for key, value in pairs.items():
        assert key in known, f"{key} is neither a template parameter nor a Beam option"
        if key in PARAMS:
            assert _accepts(PARAMS[key], value), (key, value)
    opts = SpecDecOptions(argv)
    assert opts.large_model is True and opts.device == "cuda"


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_makefile_run_direct_passes_flags_the_pipeline_accepts_and_extra_args_as_they_are():
    import shlex

    out = make_dry_run("run-direct", "CHAT_TEMPLATE=true", "SYSTEM_PROMPT=Be brief, please.",
                       "EXTRA_ARGS=--stop '###' --device_map auto")
    argv = shlex.split(out.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "pipeline.run"]
    opts = SpecDecOptions(argv[3:])
    assert (opts.stop, opts.device_map, opts.chat_template, opts.system_prompt, opts.batch_size) == (
        ["###"], "auto", True, "Be brief, please.", 16)
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(argv[3:])
    unknown = set(options.get_all_options(retain_unknown_options=True)) - set(options.get_all_options())
    assert not unknown, f"run-direct passes flags neither the pipeline nor Beam knows: {unknown}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_makefile_values_with_quotes_reach_the_job_and_a_tilde_is_refused_by_run():
    """A system prompt with an apostrophe ended the shell's '...' (a syntax error); `~` separates
    the template's parameters, so `run` refuses it in a value, naming the variable."""
    import shlex

    prompt = "Don't ramble; say 'no' if unsure."
    direct = shlex.split(make_dry_run("run-direct", f"SYSTEM_PROMPT={prompt}").replace("\\\n", " "))
    assert direct[direct.index("--system_prompt") + 1] == prompt
    run = shlex.split(make_dry_run("run", f"SYSTEM_PROMPT={prompt}").replace("\\\n", " "))
    params = run[run.index("--parameters") + 1]
    assert params.startswith("^~^") and f"~system_prompt={prompt}~" in params + "~"
    done = subprocess.run(["make", "-s", "-n", "-f", "templates/Makefile", "run", "SYSTEM_PROMPT=a~b",
                           "PROJECT=acme-ml"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "SYSTEM_PROMPT holds ~" in done.stderr, done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_run_names_the_image_the_last_image_build_pushed(tmp_path):
    """The tag was the current commit's at every make: after a commit, `run` named an image never built."""
    tag_file = tmp_path / "image-tag"
    assert f"specdec-beam:{'abc1234'}" not in make_dry_run("run", f"TAG_FILE={tag_file}")
    image = make_dry_run("image", f"TAG_FILE={tag_file}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode == 0:  # (a checkout: the image is tagged with its commit)
        assert f"specdec-beam:{commit.stdout.strip()}" in image
    assert f"> {tag_file}" in image  # recorded once pushed
    tag_file.write_text("abc1234\n")
    for target in ("run", "run-direct", "template"):
        assert "specdec-beam:abc1234" in make_dry_run(target, f"TAG_FILE={tag_file}"), target
    assert "specdec-beam:v2" in make_dry_run("run", f"TAG_FILE={tag_file}", "TAG=v2")


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@pytest.mark.parametrize("target", ["run", "run-direct"])
def test_makefile_booleans_are_true_or_false(target):
    """CHAT_TEMPLATE=1 was dropped by run-direct (an instruct model got raw prompts) and passed by run to a form
    that refuses it: both stop, naming the variable."""
    assert "--chat_template" in make_dry_run("run-direct", "CHAT_TEMPLATE=true")
    assert "--chat_template" not in make_dry_run("run-direct", "CHAT_TEMPLATE=false")
    done = subprocess.run(["make", "-s", "-n", "-f", "templates/Makefile", target, "CHAT_TEMPLATE=1",
                           "PROJECT=acme-ml", "RUN_ID=r1"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "CHAT_TEMPLATE=1: use true or false" in done.stderr, done.stderr
    # targets that run no job do not mind (an OVERWRITE=1 exported for something else)
    assert "acme-ml" in make_dry_run("print", "OVERWRITE=1")


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_makefile_passes_the_default_draft_model_with_drafter_model_only(drafter):
    """The job refuses --draft_model with a drafter that uses no draft model: DRAFTER=ngram (or none)
    alone ran into that refusal, the default DRAFT_MODEL being passed with every drafter."""
    expected = drafter == "model"
    run, direct = make_dry_run("run", f"DRAFTER={drafter}"), make_dry_run("run-direct", f"DRAFTER={drafter}")
    assert ("~draft_model=gs://acme-ml-specdec/models/draft" in run) is expected, run
    assert ("--draft_model 'gs://acme-ml-specdec/models/draft'" in direct) is expected, direct
    assert f"~drafter={drafter}" in run and f"--drafter '{drafter}'" in direct
    # one the user names is passed with any drafter, for the job to refuse in one line
    assert "--draft_model 'gs://b/d'" in make_dry_run("run-direct", f"DRAFTER={drafter}", "DRAFT_MODEL=gs://b/d")

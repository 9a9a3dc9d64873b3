"""Build the whole GPU Dataflow job offline (DataflowRunner --dry_run=True) and inspect it.

Nothing is submitted and nothing is staged: dry_run returns before the job description is
created. Realistic fake ids matter: `--project=p --temp_location=gs://b/tmp` fails Beam's
validation, and without a valid temp_location Beam tries to create a default bucket (network).
Graph construction must touch neither gs:// nor a model: preflight (which reads the input
schema and checks the models) is what the launcher runs first, so it is skipped here and the
input schema is given.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.runners.dataflow.internal import apiclient

from pipeline.options import SpecDecOptions
from pipeline.run import build_pipeline

PROJECT = "acme-specdec-prod"
BUCKET = "acme-specdec-prod-dataflow"
IMAGE = f"us-central1-docker.pkg.dev/{PROJECT}/specdec/specdec-beam:2025-01-01"
GPU = "type:nvidia-l4;count:1;install-nvidia-driver"
ACCELERATOR_URN = "beam:resources:accelerator:v1"

GPU_JOB = [
    "--runner=DataflowRunner",
    "--dry_run=True",
    f"--project={PROJECT}",
    "--region=us-central1",
    "--job_name=specdec-dryrun",
    f"--temp_location=gs://{BUCKET}/tmp",
    f"--staging_location=gs://{BUCKET}/staging",
    f"--sdk_container_image={IMAGE}",
    "--machine_type=g2-standard-4",
    f"--dataflow_service_options=worker_accelerator={GPU}",
    "--max_num_workers=4",
    "--disk_size_gb=100",
    f"--input=gs://{BUCKET}/prompts/part-*.parquet",
    f"--output=gs://{BUCKET}/runs/r1/gens",
    f"--target_model=gs://{BUCKET}/models/llama-8b",
    f"--draft_model=gs://{BUCKET}/models/llama-1b",
    "--passthrough_columns=source",
    "--device=cuda",
    "--dtype=bfloat16",
    "--large_model",
]
# Right fitting instead: the generate step's accelerator hint (machine type in it), never with worker_accelerator.
HINT = "type:nvidia-l4;count:1;machine_type:g2-standard-4;install-nvidia-driver"
RIGHT_FIT_JOB = [a for a in GPU_JOB if not a.startswith("--dataflow_service_options")] + [f"--accelerator={HINT}"]
SCHEMA = pa.schema([("id", pa.string()), ("prompt", pa.string()), ("source", pa.string())])


@pytest.fixture
def offline(monkeypatch):
    """Any gs:// access or model load during graph construction fails the test."""
    touched = []

    def forbidden(what):
        def fail(*args, **kwargs):
            touched.append((what, args[:1]))
            raise AssertionError(f"graph construction called {what}{args[:1]}")
        return fail

    for name in ("match", "open", "exists", "create", "delete", "rename", "copy", "mkdirs", "last_updated"):
        monkeypatch.setattr(FileSystems, name, staticmethod(forbidden(f"FileSystems.{name}")))
    from apache_beam.io.gcp import gcsio

    monkeypatch.setattr(gcsio.GcsIO, "__init__", forbidden("GcsIO()"))  # any GCS client at all
    import transformers

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForSeq2SeqLM,
                transformers.AutoTokenizer, transformers.AutoConfig, transformers.PreTrainedModel):
        monkeypatch.setattr(cls, "from_pretrained", classmethod(forbidden(f"{cls.__name__}.from_pretrained")))
    return touched


def _dry_run(argv):
    opts = SpecDecOptions(argv)
    p = beam.Pipeline(options=opts)
    build_pipeline(p, opts, SCHEMA)
    result = p.run()
    return opts, result


def _top_level_names(proto):
    return {t.unique_name for t in proto.components.transforms.values() if "/" not in t.unique_name}


def _generate_transforms(proto):
    """The transforms of the Generate step that run user code (ParDos), with their environment ids."""
    comps = proto.components
    out = {}
    for t in comps.transforms.values():
        if t.unique_name.startswith("Generate/") and t.spec.urn == "beam:transform:pardo:v1":
            out[t.unique_name] = t.environment_id
    return out


def test_gpu_job_graph_offline(offline):
    opts, result = _dry_run(RIGHT_FIT_JOB)
    assert str(result.state) == "DONE"
    assert offline == []
    proto = result.job.proto_pipeline
    assert {"ReadPrompts", "Generate", "Write"} <= _top_level_names(proto)

    envs = proto.components.environments
    generate = _generate_transforms(proto)
    inference = {n: e for n, e in generate.items() if "RunInference" in n and "BeamML_RunInference" in n}
    assert inference, sorted(generate)
    for name, env_id in inference.items():
        hints = envs[env_id].resource_hints
        assert hints.get(ACCELERATOR_URN) == HINT.encode(), (name, dict(hints))
    # only the generate step asks for the accelerator: reading and writing run in plain environments
    read_envs = {t.environment_id for t in proto.components.transforms.values()
                 if t.unique_name.startswith(("ReadPrompts/", "Write/")) and t.environment_id}
    assert read_envs and all(ACCELERATOR_URN not in envs[e].resource_hints for e in read_envs)
    # every environment runs the custom image
    images = {e.payload for e in envs.values() if e.urn == "beam:env:docker:v1"}
    assert images and all(IMAGE.encode() in payload for payload in images)


def test_gpu_job_environment(offline):
    """The job's worker settings, as the Dataflow API would receive them (built offline)."""
    opts, result = _dry_run(GPU_JOB)
    env = apiclient.Environment(
        packages=[], options=opts, environment_version=None,
        proto_pipeline_staged_url=f"gs://{BUCKET}/staging/pipeline.pb",
        proto_pipeline=result.job.proto_pipeline,
    ).proto
    assert list(env.service_options) == [f"worker_accelerator={GPU}"]
    pool = env.worker_pools[0]
    assert pool.machine_type == "g2-standard-4"
    assert pool.disk_size_gb == 100
    assert pool.autoscaling_settings.max_num_workers == 4
    assert {c.container_image for c in pool.sdk_harness_container_images} == {IMAGE}
    # process layout: Dataflow's default (one SDK process per vCPU) is kept, and the pair is shared
    # across those processes by --large_model instead (see docs/dataflow.md).
    assert "use_multiple_sdk_containers" in list(env.experiments)
    assert "no_use_multiple_sdk_containers" not in list(env.experiments)
    assert opts.large_model


def test_large_model_is_what_shares_the_pair(offline):
    """The handler that goes into the graph shares one copy per machine iff --large_model is set: its own
    copies (transforms/copies.py), never RunInference's sharing, which would host the pair in an SDK process."""
    from apache_beam.ml.inference.base import RunInference

    seen = {}
    real_init = RunInference.__init__

    def spy(self, model_handler, *args, **kwargs):
        seen.update(large=model_handler.large_model, share=model_handler.share_model_across_processes())
        return real_init(self, model_handler, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunInference, "__init__", spy)
        _dry_run(GPU_JOB)
        assert seen == {"large": True, "share": False}
        _dry_run([a for a in GPU_JOB if a != "--large_model"])
        assert seen == {"large": False, "share": False}


def test_no_accelerator_hint_without_the_option(offline):
    _, result = _dry_run(GPU_JOB)
    proto = result.job.proto_pipeline
    envs = proto.components.environments
    assert all(ACCELERATOR_URN not in envs[e].resource_hints for e in _generate_transforms(proto).values())


def test_flex_template_entry_point_submits_without_waiting(saved_pairs, tmp_path, monkeypatch):
    """templates/main.py with argv as the Flex launcher passes it (`--name=value`, booleans as
    `--large_model=true`): preflight, graph, DataflowRunner (dry run), and no wait for the job."""
    import pyarrow.parquet as pq
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult

    from tests.test_templates import load_template_main

    template_main = load_template_main()
    waited = []
    monkeypatch.setattr(DataflowPipelineResult, "wait_until_finish", lambda self, *a, **k: waited.append(1))
    target, draft = saved_pairs["llama"]
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(SCHEMA.empty_table(), prompts)  # preflight reads the schema only
    gpu_args = [a for a in GPU_JOB if a.split("=")[0] not in (
        "--input", "--target_model", "--draft_model", "--large_model")]
    # --device=cuda stays: the launcher VM has no GPU, and preflight must not mind
    argv = [*gpu_args, f"--input={prompts}", f"--target_model={target}", f"--draft_model={draft}",
            "--large_model=true"]
    assert template_main.run(argv) == 0
    assert waited == []


def test_durable_commits_share_the_models_environment_and_resume_builds_offline(offline):
    """Chunks are committed in the generate step's environment: a step in another environment
    is not fused with it, and on Dataflow batch it would run only after all generation."""
    _, result = _dry_run(RIGHT_FIT_JOB + [f"--resume_from=gs://{BUCKET}/runs/r0/gens", "--commit_every_s=30"])
    assert offline == []
    proto = result.job.proto_pipeline
    envs = proto.components.environments
    pardos = {t.unique_name: t.environment_id for t in proto.components.transforms.values()
              if t.spec.urn == "beam:transform:pardo:v1"}
    inference = {e for n, e in pardos.items() if "BeamML_RunInference" in n}
    commits = {e for n, e in pardos.items() if n.startswith("Commit/")}
    assert len(inference) == 1 and commits == inference
    assert envs[inference.pop()].resource_hints.get(ACCELERATOR_URN) == HINT.encode()
    assert any(n.startswith("SelectIds/ReadDoneIds/") for n in pardos)
    assert {"SelectIds", "Commit", "Write"} <= _top_level_names(proto)


def test_the_accelerator_hint_with_worker_accelerator_is_refused_before_any_work(offline):
    """Google's right-fitting guide: with the accelerator hint, don't use the worker_accelerator service option."""
    from pipeline.errors import JobConfigError
    from pipeline.preflight import preflight

    as_experiment = [a for a in GPU_JOB if not a.startswith("--dataflow_service_options")] + [
        f"--experiments=worker_accelerator={GPU}"]  # (the older way; gcloud's --additional-experiments)
    for job in (GPU_JOB, as_experiment):
        with pytest.raises(JobConfigError, match=r"^--accelerator with worker_accelerator=type:nvidia-l4;count:1;"
                                                 r"install-nvidia-driver: Dataflow's right fitting"):
            preflight(SpecDecOptions(job + [f"--accelerator={HINT}"]))
    with pytest.raises(JobConfigError, match=r"^--resource_hints accelerator with worker_accelerator="):
        preflight(SpecDecOptions(GPU_JOB + [f"--resource_hints=accelerator={HINT}"]))  # (Beam's own flag for it)
    assert offline == []

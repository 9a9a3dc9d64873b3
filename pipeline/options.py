"""The job's command-line flags (DESIGN.md, "Command line"); every Beam option passes through."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from specdec_core.cpu_speed import DRAFT_DTYPES
from specdec_core.placement import DEVICE_MAPS
from specdec_core.plan import GRAPH_MODES
from specdec_core.text import CPU_KERNELS, DRAFTERS, GAMMA_POLICIES, GeneratorSpec


def none_or(kind):
    """A flag's value, or None (no limit) for "", none or None."""
    def parse(v: str):
        return None if v in ("", "none", "None") else kind(v)
    parse.__name__ = kind.__name__  # (argparse's error names it: "invalid float value", not "invalid <lambda> value")
    return parse


def spec_default(name: str):
    """A generation setting's default as the engine's `GeneratorSpec` holds it, for the flags and checks naming it."""
    return GeneratorSpec.__dataclass_fields__[name].default


class SpecDecOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        a = parser.add_argument
        a("--input", required=True, help="Parquet file pattern of prompt rows, local or gs://")
        a("--output", required=True, help="output prefix, local or gs://: PREFIX-SSSSS-of-NNNNN.parquet")
        a("--target_model", required=True, help="target model: local directory, gs:// directory or hub id")
        a("--draft_model", default=None,
          help="draft model, same forms; required with --drafter model, refused with ngram or none")
        a("--drafter", default="model", choices=DRAFTERS, help="model, ngram (prompt lookup) or none (baseline)")
        a("--tokenizer", default=None, help="tokenizer location (default: the target's)")
        a("--prompt_column", default="prompt",
          help="input column holding each prompt: text, or a conversation (a list of {role, content} messages, "
               "always through the chat template)")
        a("--id_column", default="id", help="input column holding each row's id")
        a("--passthrough_columns", default="", help="comma-separated input columns copied to the output")
        a("--num_speculative_tokens", type=int, default=4,
          help="gamma: tokens drafted per round (with --gamma_policy adaptive: the most per round)")
        a("--gamma_policy", default="fixed", choices=GAMMA_POLICIES,
          help="fixed: always num_speculative_tokens (the paper's setting); adaptive: per item from measured "
          "acceptance and costs, backing off when drafts do not pay (greedy only; best on large targets); "
          "auto: adaptive when greedy, fixed when sampling")
        a("--cpu_kernels", default="prepacked", choices=CPU_KERNELS,
          help="CPU, fp32 (and bf16 where the CPU has native bf16): prepacked = oneDNN-prepacked linear weights "
          "(cheaper multi-token verify; used from the row count where they beat the stock kernels on this CPU, timed "
          "at load); stock = PyTorch defaults")
        a("--cuda_graphs", default="auto", choices=GRAPH_MODES,
          help="on a GPU: the target's and the draft's passes over static caches (fixed row slots when batched), "
          "replayed as CUDA graphs (auto: on CUDA, for models with full or sliding-window attention on one device; "
          "on: insist; off: eager)")
        a("--torch_compile", nargs="?", const="on", default="auto", choices=GRAPH_MODES,
          help="the passes over static caches compiled by torch.compile before they are captured (fewer, fused "
          "kernels per pass; a minute to a few minutes of compiling per worker and batch width), the draft's steps "
          "chained (auto: wherever --cuda_graphs puts passes in graphs, on a GPU; on: also with --cuda_graphs on on a "
          "CPU; off)")
        a("--draft_dtype", default=spec_default("draft_dtype"), choices=DRAFT_DTYPES,
          help="the draft model's weights only (the target keeps --dtype, so outputs are unchanged): auto = "
          "--dtype, with the large linears of an fp32 CPU draft in bf16 where the CPU has native bf16; same = "
          "--dtype; int8 = dynamic int8 linears (CPU only): cheaper draft steps, see docs/performance.md")
        a("--max_new_tokens", type=int, default=128, help="generation length cap")
        a("--batch_size", type=int, default=1,
          help="prompts a worker decodes together (continuous batching, exact per prompt); "
          "1 = one prompt at a time. Decoder-only and encoder-decoder targets alike")
        a("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
        a("--top_k", type=none_or(int), default=None, help="top-k sampling (sampling only)")
        a("--top_p", type=none_or(float), default=None, help="nucleus sampling (sampling only)")
        a("--seed", type=int, default=0, help="base seed; each item's seed derives from it and the item's id")
        a("--device", default="auto",
          help="auto, cpu, cuda or cuda:N; cuda (or auto with GPUs): one copy of the pair per GPU of the worker")
        a("--device_map", default="none", choices=DEVICE_MAPS,
          help="none: each copy of the pair on one GPU; auto: each copy split over the fewest GPUs that hold "
          "it, for a target larger than one GPU")
        a("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
          help="model dtype; auto is float32 on CPU, bfloat16 on CUDA")
        a("--ngram_max_size", type=int, default=spec_default("ngram_max_size"),
          help="--drafter ngram: longest n-gram to match")
        a("--ngram_min_size", type=int, default=spec_default("ngram_min_size"),
          help="--drafter ngram: shortest n-gram to match")
        a("--large_model", action="store_true", default=False,
          help="load one copy of the pair per machine, shared by all SDK processes (GPU workers)")
        a("--chat_template", action="store_true", default=False,
          help="apply the tokenizer's chat template: each prompt becomes the user message, with the generation "
          "prompt added (conversation columns always go through it)")
        a("--system_prompt", default=None,
          help="with --chat_template or a conversation column: a system message put first (conversations that "
          "open with their own system message keep it); '' puts an empty one, which suppresses a template's "
          "default system prompt")
        a("--stop", action="append", default=None,
          help="stop string (repeatable): generation ends at its first occurrence in the output, which it is "
          "cut from; finish_reason is stop")
        a("--accelerator", default=None,
          help="Dataflow right fitting: the accelerator resource hint of the generate step only, e.g. "
          "type:nvidia-l4;count:1;machine_type:g2-standard-4;install-nvidia-driver (not with worker_accelerator)")
        a("--commit_every_s", type=float, default=60.0,
          help="seconds between durable commits of finished rows per worker (PREFIX-chunk-*.parquet); "
          "a crash loses at most this much finished work per worker")
        a("--resume_from", action="append", default=None,
          help="output prefix of an earlier run (repeatable, or comma-separated): ids with a result row "
          "there are skipped, ids that only failed are tried again")
        a("--max_item_seconds", type=none_or(float), default=None,
          help="wall-time limit per item: a longer item fails with error_type ItemTimeout")
        a("--overwrite", action="store_true", default=False,
          help="delete the output files already under --output and write there (otherwise such files stop the job)")
        a("--trust_remote_code", action="store_true", default=False,
          help="allow models whose config needs their own Python code (auto_map); otherwise they are refused")

    def passthrough(self) -> list[str]:
        return [c.strip() for c in (self.passthrough_columns or "").split(",") if c.strip()]

    def input_columns(self) -> list[str]:
        """The input columns the job reads, each once."""
        return list(dict.fromkeys([self.id_column, self.prompt_column, *self.passthrough()]))

    def generator_spec(self) -> GeneratorSpec:
        return GeneratorSpec(
            target_model=self.target_model,
            draft_model=self.draft_model,
            tokenizer=self.tokenizer,
            drafter=self.drafter,
            num_speculative_tokens=self.num_speculative_tokens,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            ngram_max_size=self.ngram_max_size,
            ngram_min_size=self.ngram_min_size,
            device=self.device,
            device_map=self.device_map,
            dtype=self.dtype,
            gamma_policy=self.gamma_policy,
            cpu_kernels=self.cpu_kernels,
            cuda_graphs=self.cuda_graphs,
            torch_compile=self.torch_compile,
            draft_dtype=self.draft_dtype,
            chat_template=self.chat_template,
            system_prompt=self.system_prompt,
            stop=tuple(self.stop or ()),
            max_item_seconds=self.max_item_seconds,
            trust_remote_code=self.trust_remote_code,
            batch_size=self.batch_size,
        )

    def resume_prefixes(self) -> list[str]:
        """--resume_from values; commas separate prefixes too (a template parameter has one value)."""
        return list(dict.fromkeys(p.strip() for v in self.resume_from or [] for p in v.split(",") if p.strip()))

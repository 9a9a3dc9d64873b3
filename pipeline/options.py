"""The job's command-line flags (DESIGN.md, "Command line"); every Beam option passes through."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from specdec_core.text import CPU_KERNELS, DRAFTERS, GAMMA_POLICIES, GeneratorSpec


def _none_or(kind):
    return lambda v: None if v in ("", "none", "None") else kind(v)


class SpecDecOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        a = parser.add_argument
        a("--input", required=True, help="Parquet file pattern of prompt rows, local or gs://")
        a("--output", required=True, help="output prefix, local or gs://: PREFIX-SSSSS-of-NNNNN.parquet")
        a("--target_model", required=True, help="target model: local directory, gs:// directory or hub id")
        a("--draft_model", default=None, help="draft model, same forms; required when --drafter model")
        a("--drafter", default="model", choices=DRAFTERS, help="model, ngram (prompt lookup) or none (baseline)")
        a("--tokenizer", default=None, help="tokenizer location (default: the target's)")
        a("--prompt_column", default="prompt", help="input column holding the prompt text")
        a("--id_column", default="id", help="input column holding each row's id")
        a("--passthrough_columns", default="", help="comma-separated input columns copied to the output")
        a("--num_speculative_tokens", type=int, default=4,
          help="gamma: tokens drafted per step (with --gamma_policy adaptive: the most per step)")
        a("--gamma_policy", default="fixed", choices=GAMMA_POLICIES,
          help="fixed: always num_speculative_tokens (the paper's setting); adaptive: per item from measured "
          "acceptance and costs, backing off when drafts do not pay (greedy only; best on large targets); "
          "auto: adaptive when greedy, fixed when sampling")
        a("--cpu_kernels", default="prepacked", choices=CPU_KERNELS,
          help="CPU fp32 only: prepacked = oneDNN-prepacked linear weights (cheaper multi-token verify); "
          "stock = PyTorch defaults")
        a("--max_new_tokens", type=int, default=128, help="generation length cap")
        a("--batch_size", type=int, default=1,
          help="prompts a worker decodes together (continuous batching, exact per prompt); "
          "1 = one prompt at a time. Decoder-only targets only")
        a("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
        a("--top_k", type=_none_or(int), default=None, help="top-k sampling (sampling only)")
        a("--top_p", type=_none_or(float), default=None, help="nucleus sampling (sampling only)")
        a("--seed", type=int, default=0, help="base seed; each item's seed derives from it and the item's id")
        a("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        a("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
          help="model dtype; auto is float32 on CPU, bfloat16 on CUDA")
        a("--ngram_max_size", type=int, default=3, help="--drafter ngram: longest n-gram to match")
        a("--ngram_min_size", type=int, default=1, help="--drafter ngram: shortest n-gram to match")
        a("--large_model", action="store_true", default=False,
          help="load one copy of the pair per machine, shared by all SDK processes (GPU workers)")
        a("--accelerator", default=None,
          help="accelerator resource hint for the generate step only, "
          "e.g. type:nvidia-l4;count:1;install-nvidia-driver")

    def passthrough(self) -> list[str]:
        return [c.strip() for c in (self.passthrough_columns or "").split(",") if c.strip()]

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
            dtype=self.dtype,
            gamma_policy=self.gamma_policy,
            cpu_kernels=self.cpu_kernels,
            batch_size=self.batch_size,
        )

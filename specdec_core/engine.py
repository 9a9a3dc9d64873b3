"""Speculative decoding of one prompt at a time (Leviathan, Kalman, Matias 2023): the round loop
(`rounds.RoundEngine`) over one row, whose target cache is a static cache of one row when the plan
takes one, else a growing cache of one row (`BatchKV`)."""

from __future__ import annotations

import contextlib
import time

from transformers import PreTrainedModel

from specdec_core.attention import attention_kernels
from specdec_core.batch_kv import BatchKV
from specdec_core.drafters import Drafter, ModelDrafter, NoDrafter, open_row
from specdec_core.gamma import Costs, GammaPolicy, fixed_gamma
from specdec_core.loading import context_limit
from specdec_core.pass_settings import DEFAULT, PassSettings
from specdec_core.plan import slot_kv_for
from specdec_core.processing import SamplingSettings
from specdec_core.rounds import RoundEngine, check_prompts, setup_seconds
from specdec_core.rows import FinishCheck, Generation, Row
from specdec_core.slot_kv import SlotKV


class SpeculativeGenerator(RoundEngine):
    """Exact speculative decoding of one prompt at a time: the round loop (`RoundEngine._round`) over one row."""

    def __init__(self, target: PreTrainedModel, drafter: Drafter | None = None, *, num_speculative_tokens: int = 4,
                 max_new_tokens: int = 128, sampling: SamplingSettings = SamplingSettings(),
                 gamma_policy: GammaPolicy | None = None, cuda_graphs: str = "auto", torch_compile: bool = False,
                 settings: PassSettings = DEFAULT):
        """cuda_graphs: the target's passes over a static cache replayed as CUDA graphs ("auto": on CUDA where the
        model allows it, "on", "off"); torch_compile: those passes compiled before capture."""
        super().__init__(target, drafter, num_speculative_tokens, max_new_tokens, sampling, gamma_policy, settings)
        self.static = slot_kv_for(target, cuda_graphs, compile=torch_compile, settings=settings)

    def measure_costs(self, prompt_ids: list[int], ks: tuple[int, ...] | None = None, reps: int = 2) -> Costs:
        """c and v(k) of this pair on this machine, in 1-token target passes, timed on the prompt's cache."""
        ks = ks or tuple(range(2, self.gamma + 2))
        if not self.target.config.is_encoder_decoder:  # timed after the prompt: max(ks) - 1 more tokens fit
            models = [self.target] + ([self.drafter.model] if isinstance(self.drafter, ModelDrafter) else [])
            limit = context_limit(*models)
            if limit is not None:
                prompt_ids = prompt_ids[: max(1, limit - max(ks) + 1)]
        row = Row.begin(self.target, prompt_ids, 0, self.sampling, self.max_new_tokens, fixed_gamma.start(self.gamma))
        with contextlib.ExitStack() as held:
            tkv, dkv = self._caches(row, prompt_ids, held)  # the passes the items will run (graphs or not)
            if dkv is not None and len(row.seq) > 1:
                dkv.forward([row.seq[:-1]], logits=False)
            return self._time_passes([row], tkv, dkv, ks, reps)

    def generate(self, prompt_ids: list[int], seed: int = 0, finish_check: FinishCheck | None = None,
                 max_seconds: float | None = None) -> Generation:
        """max_seconds: raise ItemTimeout at the first round past this many seconds of the item's own (`Row.own_s`)."""
        check_prompts([prompt_ids])
        with attention_kernels(self.target.device, self.settings.cudnn_attention), contextlib.ExitStack() as held:
            if self.gamma_policy.needs_costs and not isinstance(self.drafter, NoDrafter):
                # Once per process, before this item's clock starts.
                self.gamma_policy.set_costs(self.measure_costs(prompt_ids))
            row = Row.begin(self.target, prompt_ids, seed, self.sampling, self.max_new_tokens,
                            self.gamma_policy.start(self.gamma), finish_check=finish_check)
            row.setup = self._setup()
            tkv, dkv = self._caches(row, prompt_ids, held)
            return self._rounds(row, tkv, dkv, max_seconds)

    def _setup(self) -> float:
        return setup_seconds(self.static, getattr(self.drafter, "static", None))

    def _caches(self, row: Row, prompt_ids: list[int], held: contextlib.ExitStack
                ) -> tuple[SlotKV | BatchKV, SlotKV | BatchKV | None]:
        """The target's cache (the prompt read but the newest token) and a model draft's, empty until it drafts, else
        None (the row's session drafts): each model's one static slot when free, else a growing one-row cache."""
        tkv = open_row(self.target, self.static, prompt_ids, held)
        if len(row.seq) > 1:
            tkv.forward([row.seq[:-1]], logits=False)
        if isinstance(self.drafter, ModelDrafter):
            return tkv, self.drafter.open(prompt_ids, held, tkv.encoded if self.shared_encoder else None)
        row.session = self.drafter.start(prompt_ids, row.seq, row.picker(self.sampling.greedy))
        return tkv, None

    def _rounds(self, row: Row, tkv: SlotKV | BatchKV, dkv: SlotKV | BatchKV | None,
                max_seconds: float | None) -> Generation:
        """Rounds (`_round`) until the item ends."""
        row.stats.prefill_s, row.stats.prefill_setup_s = time.perf_counter() - row.start, self._setup() - row.setup
        while not row.finish:
            if max_seconds is not None and row.own_s(self._setup()) > max_seconds:
                raise row.timeout(max_seconds)
            self._round([row], tkv, dkv)
        row.stats.admit_s = row.stats.prefill_s - row.stats.prefill_setup_s
        row.stats.setup_s = self._setup() - row.setup
        return row.result()

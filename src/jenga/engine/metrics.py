"""``EngineMetrics``: the engine's lifetime counters (steps, tokens, KV peaks, encoder runs,
speculative-decoding acceptance)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineMetrics:
    """Counters over the engine's lifetime (``LLM.reset_metrics`` zeroes them)."""

    steps: int = 0
    step_s: float = 0.0  # wall time inside step()
    model_s: float = 0.0  # of which the model forward alone (metadata building excluded)
    prompt_tokens: int = 0
    output_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    peak_used_bytes: int = 0  # pages held by live requests
    peak_needed_bytes: int = 0  # bytes live requests really read
    waste_frac_sum: float = 0.0
    kv_samples: int = 0
    encoder_runs: int = 0  # images run through the vision encoder (VLMs)
    spec_proposed: int = 0  # speculative decoding: draft tokens proposed
    spec_accepted: int = 0  # ... of which the target kept
    spec_verifications: int = 0  # request verifications (one per sampling request per step)
    spec_emitted: int = 0  # tokens they emitted (kept drafts + one each)
    spec_target_forwards: int = 0  # target forwards (one per step)

    @property
    def acceptance_rate(self) -> float:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        """Tokens a request gets from one target forward (1 without speculation)."""
        return self.spec_emitted / self.spec_verifications if self.spec_verifications else 0.0

    @property
    def overhead_s(self) -> float:
        """Time in the step outside the model forward (scheduling, manager, metadata, sampling)."""
        return self.step_s - self.model_s

    @property
    def waste_frac_mean(self) -> float:
        return self.waste_frac_sum / self.kv_samples if self.kv_samples else 0.0

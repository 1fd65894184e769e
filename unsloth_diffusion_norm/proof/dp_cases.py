"""The cases of the launched-rank runs: which examples each rank trains on, and how. `CASES` are the
data-parallel ones (`data_parallel`); `SHARDED` are those run under every sharded engine (`sharded`)."""

from dataclasses import asdict, dataclass, replace

from .fixtures import LONG, SHORT, Example, answers, unsupervised


@dataclass
class Case:
    ranks: int
    per_rank: list  # rank -> its examples, in order
    gradient_accumulation_steps: int = 2
    average_tokens_across_devices: bool = True
    # False: the per-micro-batch normalization (the unpatched release, or the 'microbatch' flag on a
    # natively fixed one), a control that must miss the oracle.
    patched: bool = True
    evaluate: bool = False
    # Unsloth's gradient-accumulation rewrite of transformers.Trainer (installed on GPU hosts at load
    # time). Irreversible in a process, so such cases run last in their launch.
    unsloth_ga_trainer: bool = False
    # Train with a checkpoint every `resume_at` steps, resume from the first one in a fresh trainer,
    # and compare the final parameters with the uninterrupted run's (then judge the resumed steps).
    resume_at: int = None
    diffusion_noise: str = None  # the per-run noise flag
    t_sampler: str = None  # diffusion_t_sampler ("stratified": with per-sample noise)
    complementary: bool = False  # diffusion_complementary_masks
    # diffusion_eval_noise: with "fixed" the case evaluates at every step, and trains again without evaluating
    # (and with the field unset, both ways) to show that evaluating leaves the training as it was.
    eval_noise: str = None
    lora: str = None  # fixtures.load_model's LoRA variant
    model_config: dict = None  # fields the tiny checkpoint's config gets (e.g. NVIDIA's dp_varying_mask_ratio)
    seed: int = 3  # realized counts differ between micro-batches and between ranks
    # The objective and the step, as the one-process configurations draw them: the noise floor (None: the
    # profile's), the 1/p weighting, clipping (0.0: none).
    eps: float = None
    inverse_t: bool = True
    max_grad_norm: float = 0.0

    def block(self):
        """NVIDIA's block-diffusion settings the case's model config asks for (the oracle's), or None."""
        from .oracle import BlockDiffusion

        config = self.model_config or {}
        return BlockDiffusion(config["block_size"]) if config.get("dlm_paradigm") == "block_diff" else None

    def plain(self):
        """Whether the case runs at the objective's and the step's defaults."""
        return self.eps is None and self.inverse_t and not self.max_grad_norm

    def collectives(self, native):
        """Collectives the library issues per window besides an engine's own traffic. One gather carries the count
        and the run's metrics; where Unsloth 2026.10.7+ draws the window at its fetch (per-sample noise, or the
        checkpoint's own DP-varying ratio) its code gathers the count and the metrics take one gather of their own;
        a block-diffusion window is always the plugin's to fetch. Rank-local counts exchange nothing."""
        if not self.average_tokens_across_devices:
            return 0
        drawn_at_fetch = self.diffusion_noise == "per_sample" or bool(self.model_config)
        return 1 + (native and self.block() is None and drawn_at_fetch)

    def examples(self):
        """The global order: accelerate deals micro-batches round-robin (rank r gets r, r+W, ...)."""
        return [rank[i] for i in range(len(self.per_rank[0])) for rank in self.per_rank]

    def to_json(self):
        """The case as JSON values (a drawn case travels to the launched ranks in a file)."""
        return asdict(self)

    @classmethod
    def from_json(cls, values):
        per_rank = [[Example(**example) for example in rank] for rank in values["per_rank"]]
        return cls(**{**values, "per_rank": per_rank})


# The tiny checkpoint configured as NVIDIA's SFT recipe configures the 8B (blocks of 4: the answers span several).
BLOCK_DIFF = {"dlm_paradigm": "block_diff", "block_size": 4}

CASES = {
    "unequal-counts": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], evaluate=True),
    "unequal-counts-unpatched": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], patched=False),
    "rank-with-zero-masked-tokens": Case(2, [answers(LONG, 2), unsupervised(2)]),
    "all-ranks-empty": Case(2, [unsupervised(2), unsupervised(2)]),
    "rank-local-counts": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], average_tokens_across_devices=False),
    "ga3-partial-last-window": Case(
        2,
        [answers(LONG, 2) + answers(SHORT, 2, 14), answers(SHORT, 3, 16) + answers(LONG, 1, 19)],
        gradient_accumulation_steps=3,
    ),
    "unequal-counts-unsloth-ga-trainer": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], unsloth_ga_trainer=True),
    "resume-mid-epoch": Case(2, [answers(LONG, 8), answers(SHORT, 8, 14)], resume_at=2),
    "per-sample-noise": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], diffusion_noise="per_sample"),
    "per-sample-resume": Case(2, [answers(LONG, 8), answers(SHORT, 8, 14)], resume_at=2, diffusion_noise="per_sample"),
    # NVIDIA's own switch in the model config: per-sample noise with diffusion_noise left at None.
    "nvidia-dp-varying-mask-ratio": Case(
        2, [answers(LONG, 2), answers(SHORT, 2, 14)], model_config={"dp_varying_mask_ratio": True}
    ),
    # Lower-variance noise: strata over both ranks' examples (n = 2 ranks x GA 2), and mask pairs.
    "stratified-levels": Case(
        2, [answers(LONG, 2), answers(SHORT, 2, 14)], diffusion_noise="per_sample", t_sampler="stratified"
    ),
    "complementary-masks": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], complementary=True),
    "fixed-eval-noise": Case(2, [answers(LONG, 4), answers(SHORT, 4, 14)], evaluate=True, eval_noise="fixed"),
    # NVIDIA's block-diffusion mode (2026.10.4-.6): both counts summed across ranks in the one gather, or rank-local.
    "block-diffusion": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], model_config=BLOCK_DIFF),
    "block-diffusion-rank-local": Case(
        2, [answers(LONG, 2), answers(SHORT, 2, 14)], average_tokens_across_devices=False, model_config=BLOCK_DIFF
    ),
    "three-ranks": Case(3, [answers(LONG, 2), answers(SHORT, 2, 14), answers(LONG[:7], 2, 16)], evaluate=True),
    "three-ranks-rank-local": Case(
        3, [answers(LONG, 2), answers(SHORT, 2, 14), answers(LONG[:7], 2, 16)], average_tokens_across_devices=False
    ),
}

UNEQUAL = [answers(LONG, 2), answers(SHORT, 2, 14)]
# The data-parallel cases (evaluation is left to the DDP runs), and LoRA with the output head frozen.
SHARDED = {
    "unequal-counts": replace(CASES["unequal-counts"], evaluate=False),
    "unequal-counts-unpatched": CASES["unequal-counts-unpatched"],
    "rank-with-zero-masked-tokens": CASES["rank-with-zero-masked-tokens"],
    "all-ranks-empty": CASES["all-ranks-empty"],
    "rank-local-counts": CASES["rank-local-counts"],
    "ga3-partial-last-window": CASES["ga3-partial-last-window"],
    "lora-frozen-head": Case(2, UNEQUAL, lora="frozen-head"),
    "per-sample-noise": CASES["per-sample-noise"],
    "resume-mid-epoch": CASES["resume-mid-epoch"],
    "block-diffusion": CASES["block-diffusion"],
}

"""Noise you can trust: a run resumed from a checkpoint draws the same masks as the uninterrupted run."""

import pytest
import torch

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.verify import experiment, judging
from unsloth_diffusion_norm.verify.fixtures import equal_answers

MODE = unsloth_diffusion_norm.apply().mode
EXAMPLES = equal_answers(8)  # GA 2: 4 steps


# Resume-exact global draws: the default where the plugin patches, an opt-in on 2026.10.7+ (which draws
# while fetching a window, before Trainer restores the RNG).
RESUME_EXACT = {} if MODE == registry.PATCHED else {"diffusion_noise": "global"}


@pytest.mark.parametrize("normalization", [None, "microbatch"])
def test_resumed_run_is_bitwise_the_uninterrupted_one(plugin, normalization):
    flag = {} if normalization is None else {"diffusion_loss_normalization": normalization}
    flag.update(RESUME_EXACT)
    runs = experiment.train_and_resume(EXAMPLES, at=2, seed=0, **flag)
    assert (len(runs.full.windows), len(runs.resumed.windows)) == (4, 2)
    assert runs.difference == 0.0
    if normalization is None:  # and the resumed steps are the oracle's, like any other
        assert all(judging.judge(runs.resumed, window).ok for window in runs.resumed.windows)


@pytest.mark.parametrize("normalization", [None, "microbatch"])
def test_per_sample_resume_is_bitwise_on_every_release(plugin, normalization):
    flag = {} if normalization is None else {"diffusion_loss_normalization": normalization}
    runs = experiment.train_and_resume(EXAMPLES, at=2, seed=0, diffusion_noise="per_sample", **flag)
    assert runs.difference == 0.0


def test_per_sample_noise_differs_between_examples_and_seeds(plugin):
    first = experiment.train(EXAMPLES, seed=0, diffusion_noise="per_sample")
    levels = [t for w in first.windows for batch in judging.noise_levels(w.batches, w.rng_state) for t in batch]
    assert len(set(levels)) == len(levels) == len(EXAMPLES)
    other = experiment.train(EXAMPLES, seed=1, diffusion_noise="per_sample")
    others = [t for w in other.windows for batch in judging.noise_levels(w.batches, w.rng_state) for t in batch]
    assert not set(levels) & set(others)


def test_noise_flag_validates_and_round_trips(plugin, tmp_path):
    import json

    from unsloth.models.diffusion_trainer import DiffusionConfig

    args = DiffusionConfig(output_dir=str(tmp_path), diffusion_noise="per_sample", bf16=False, use_cpu=True)
    assert json.loads(args.to_json_string())["diffusion_noise"] == "per_sample"
    with pytest.raises(ValueError, match="diffusion_noise must be 'global' or 'per_sample' or None"):
        DiffusionConfig(output_dir=str(tmp_path), diffusion_noise="per_rank", bf16=False, use_cpu=True)


@pytest.mark.skipif(MODE != registry.NATIVE, reason="a natively fixed release")
def test_native_default_is_not_resume_exact_and_the_opt_in_draws_the_same_masks(plugin):
    """What the opt-in fixes, measured: Unsloth's own draws, made while fetching, differ after a resume;
    with diffusion_noise="global" an uninterrupted run is bitwise Unsloth's own."""
    assert experiment.train_and_resume(EXAMPLES, at=2, seed=0).difference > 1e-3
    own = experiment.train(EXAMPLES, seed=0)
    deferred = experiment.train(EXAMPLES, seed=0, diffusion_noise="global")
    for a, b in zip(own.windows, deferred.windows):
        assert a.logged_loss == b.logged_loss
        assert all(torch.equal(a.params_after[n], b.params_after[n]) for n in a.params_after)

"""One wrapper contract for every patch: each hands the caller's arguments on to the original, a keyword the
release does not know (one a later transformers or Unsloth adds) included, with only what it must replace
replaced. Stand-in classes take Unsloth's and Trainer's place; the patches are the real ones."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from unsloth_diffusion_norm import (
    batch_keys,
    config,
    construction,
    detect,
    native,
    patched,
    registry,
    wrappers,
)
from unsloth_diffusion_norm.batch_keys import SLOT, UNSLOTH_PREPARED
from unsloth_diffusion_norm.registry import Patch
from unsloth_diffusion_norm.window import Window

FUTURE = {"future_option": 1}  # a keyword no release knows


def arguments(**flags):
    return SimpleNamespace(
        seed=0,
        world_size=1,
        process_index=0,
        per_device_train_batch_size=1,
        average_tokens_across_devices=False,
        **flags,
    )


@dataclasses.dataclass
class Profile:
    """A masked-diffusion profile: its own compute_loss and prepare_batch, which take any extra keyword."""

    name: str = "nemotron_labs_diffusion"
    loss_normalization: str = config.MASKED_TOKENS
    seen: list = dataclasses.field(default_factory=list)  # shared with a dataclasses.replace copy

    def compute_loss(self, model, inputs, args, num_items_in_batch=None, **extra):
        return "the release's loss", inputs, num_items_in_batch, extra

    def prepare_batch(self, model, inputs, args, **extra):
        self.seen.append(extra)
        masked = torch.tensor([[False, True]])
        return inputs["input_ids"], None, torch.ones_like(masked), masked, torch.full(masked.shape, 0.5)


class Trainer:
    """transformers.Trainer, as far as the wrappers reach into it."""

    def __init__(self, args=None, diffusion_profile=None, **extra):
        self.args, self.diffusion_profile, self.extra = args, diffusion_profile, extra
        self.accelerator = SimpleNamespace(num_processes=1)
        self.callbacks = []

    def get_batch_samples(self, epoch_iterator, num_batches, device=None, **extra):
        return [next(epoch_iterator) for _ in range(num_batches)], (device, extra)

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def pop_callback(self, callback):
        self.callbacks.remove(callback)

    def _prepare_inputs(self, inputs):
        return inputs

    def _uses_global_masked_tokens(self):
        return self.diffusion_profile.loss_normalization == config.GLOBAL_MASKED_TOKENS


class Masked:  # the release's MaskedDiffusionProfile: the stand-ins are not one, so __init__ stops early
    pass


def release(shape=detect.CHUNKED):
    class DiffusionTrainer(Trainer):
        pass

    return wrappers.Release(
        shape, SimpleNamespace(DiffusionTrainer=DiffusionTrainer), SimpleNamespace(MaskedDiffusionProfile=Masked)
    )


def rows(n):
    return [{"input_ids": torch.tensor([[10, 20 + i]])} for i in range(n)]


def applied(patch):
    patch.apply()
    return patch


# --- class-level patches -------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [None, config.PER_SAMPLE])
def test_get_batch_samples_hands_an_unknown_keyword_to_trainers_own(state, noise):
    """A run normalized per micro-batch gets Trainer's own answer, to the same call (the epoch iterator
    replaced by the tagging one for per-sample noise)."""
    the_release = release()
    DiffusionTrainer = the_release.trainer_module.DiffusionTrainer
    patch = applied(
        Patch(
            "get_batch_samples",
            DiffusionTrainer,
            "get_batch_samples",
            wrappers.wrap(patched._get_batch_samples, the_release),
            "why",
        )
    )
    trainer = DiffusionTrainer(arguments(diffusion_noise=noise), Profile())
    batches, (device, extra) = trainer.get_batch_samples(iter(rows(3)), 2, "cpu", future_option=1)
    assert (len(batches), device, extra) == (2, "cpu", FUTURE)
    batches, (device, extra) = trainer.get_batch_samples(epoch_iterator=iter(rows(3)), num_batches=1, **FUTURE)
    assert (len(batches), device, extra) == (1, None, FUTURE)
    tagged = noise == config.PER_SAMPLE
    assert all((batch_keys.ROWS in batch) == tagged for batch in batches)
    assert trainer.callbacks == ([vars(trainer)[registry.PER_TRAINER].order] if tagged else [])
    patch.revert()


def test_profile_compute_loss_hands_an_unknown_keyword_to_the_releases_own():
    class Own(Profile):
        pass

    patch = applied(
        Patch("compute_loss", Own, "compute_loss", wrappers.wrap(patched._profile_compute_loss, release()), "why")
    )
    inputs = rows(1)[0]
    assert Own().compute_loss("model", inputs, arguments(), 7, future_option=1) == (
        "the release's loss",
        inputs,
        7,
        FUTURE,
    )
    assert Own().compute_loss(model="model", inputs=inputs, args=arguments(), **FUTURE)[2:] == (None, FUTURE)
    patch.revert()


@pytest.mark.parametrize("wrapper", [patched._trainer_init, native._trainer_init, construction._refuse_flags])
def test_trainer_init_hands_an_unknown_keyword_to_the_releases_own(wrapper):
    the_release = release()
    DiffusionTrainer = the_release.trainer_module.DiffusionTrainer
    patch = applied(Patch("__init__", DiffusionTrainer, "__init__", wrappers.wrap(wrapper, the_release), "why"))
    profile = SimpleNamespace(name="block")
    trainer = DiffusionTrainer(arguments(), profile, future_option=1)
    assert (trainer.diffusion_profile, trainer.extra) == (profile, FUTURE)
    patch.revert()


def test_config_init_hands_an_unknown_keyword_to_the_releases_own():
    class DiffusionConfig:
        def __init__(self, **extra):
            self.extra = extra

    patch = applied(Patch("__init__", DiffusionConfig, "__init__", construction._config_init, "why"))
    made = DiffusionConfig(diffusion_noise="global", future_option=1)
    assert (made.extra, made.diffusion_noise, made.diffusion_loss_normalization) == (FUTURE, "global", None)
    patch.revert()


# --- per-trainer patches (2026.10.7+) ------------------------------------------------------------------


def trainer_with_patches(noise):
    """A Nemotron trainer with what trainer_patches gives it for `noise`, applied."""
    profile = Profile(loss_normalization=config.GLOBAL_MASKED_TOKENS)
    trainer = Trainer(arguments(), profile)
    registry.apply_to_trainer(trainer, native.trainer_patches(release(detect.UPSTREAM), trainer, noise))
    return trainer, profile


def test_per_sample_patches_hand_an_unknown_keyword_to_the_releases_own(state):
    trainer, profile = trainer_with_patches(config.PER_SAMPLE)
    batches, (device, extra) = trainer.get_batch_samples(iter(rows(3)), 2, "cpu", future_option=1)
    assert (len(batches), device, extra) == (2, "cpu", FUTURE) and all(batch_keys.ROWS in b for b in batches)
    batches, (device, extra) = trainer.get_batch_samples(epoch_iterator=iter(rows(1)), num_batches=1, **FUTURE)
    assert (device, extra) == (None, FUTURE) and batch_keys.ROWS in batches[0]
    # Evaluation (no keys): the release's own draws, to the same call.
    trainer.diffusion_profile.prepare_batch("model", rows(1)[0], trainer.args, future_option=1)
    assert profile.seen == [FUTURE]


def test_draws_at_the_first_step_hand_an_unknown_keyword_to_the_releases_own(state):
    trainer, profile = trainer_with_patches(config.GLOBAL)
    batches, window = trainer.get_batch_samples(iter(rows(3)), 2, "cpu", future_option=1)  # fetched, not drawn
    assert [b[SLOT] for b in batches] == [0, 1] and isinstance(window, Window) and profile.seen == []
    copy = trainer.diffusion_profile
    loss, inputs, count, extra = copy.compute_loss("model", batches[0], trainer.args, window, future_option=1)
    assert (loss, int(count), extra) == ("the release's loss", 2, FUTURE) and profile.seen == [{}, {}]
    assert UNSLOTH_PREPARED in inputs and inputs["input_ids"] is batches[0]["input_ids"]
    found = copy.compute_loss(model="model", inputs=batches[1], args=trainer.args, num_items_in_batch=window, **FUTURE)
    assert (int(found[2]), found[3]) == (2, FUTURE) and UNSLOTH_PREPARED in found[1]
    # Outside a window (evaluation, a direct call): the release's own, to the same call.
    assert copy.compute_loss("model", rows(1)[0], trainer.args, future_option=1)[2:] == (None, FUTURE)


def test_the_native_fetch_counts_every_process_as_upstreams_loss_scales_by_every_process(state):
    """On 2026.10.7+ the window is fetched undrawn and upstream's compute_loss, which multiplies the loss by every
    process, divides by its count: every process's count summed, a tensor-parallel pair's batch twice. The
    plugin's own rule (each batch once) would halve that count here and double the gradient."""
    from accelerate import ParallelismConfig

    args = arguments()
    args.average_tokens_across_devices, args.world_size = True, 4
    trainer = Trainer(args, Profile())
    trainer.accelerator = SimpleNamespace(
        num_processes=4,
        parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
        gather=lambda count: torch.cat([count + rank for rank in range(4)]),  # the other ranks' counts, made up
    )
    registry.apply_to_trainer(trainer, [native._fetch_undrawn_patch(trainer)])
    _, window = trainer.get_batch_samples(iter(rows(1)), 1)
    assert window.reduce_count(torch.tensor([10])) == 10 + 11 + 12 + 13 and window.loss_scale == 1

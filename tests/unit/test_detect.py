"""Shape recognition by features, on stand-in modules shaped like each Unsloth release (no Unsloth here)."""

import dataclasses
from types import SimpleNamespace

from unsloth_diffusion_norm import detect


def release(shape):
    """Stand-ins for unsloth.models.diffusion_{trainer,masked,profiles} of one code shape."""

    @dataclasses.dataclass
    class DiffusionConfig:
        diffusion_eps: float = None

    @dataclasses.dataclass
    class MaskedDiffusionProfile:
        name: str = "nemotron_labs_diffusion"
        pad_with_eos: bool = True
        shift_logits: bool = False
        loss_normalization: str = "masked_tokens"

        def compute_loss(self, model, inputs, args, num_items_in_batch=None): ...
        def _token_ids(self, model, args): ...
        def option(self, args, name): ...

    class DiffusionTrainer:
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None): ...

    names = {"dense": detect.DENSE_NAMES, "chunked": detect.CHUNKED_NAMES, "native": detect.CHUNKED_NAMES}[shape]
    masked = SimpleNamespace(MaskedDiffusionProfile=MaskedDiffusionProfile, **{n: object() for n in names})
    nemotron = MaskedDiffusionProfile()
    if shape == "native":
        MaskedDiffusionProfile.prepare_batch = lambda self, model, inputs, args: None
        DiffusionTrainer.get_batch_samples = lambda self, it, n, device=None: None
        DiffusionTrainer._uses_global_masked_tokens = lambda self: True
        nemotron.loss_normalization = "global_masked_tokens"
    trainer = SimpleNamespace(DiffusionTrainer=DiffusionTrainer, DiffusionConfig=DiffusionConfig)
    profiles = SimpleNamespace(diffusion_profiles=lambda: [nemotron])
    return trainer, masked, profiles


def test_each_release_shape_is_recognised():
    assert detect.recognise(*release("dense")) == (detect.DENSE, [])
    assert detect.recognise(*release("chunked")) == (detect.CHUNKED, [])
    assert detect.recognise(*release("native")) == (detect.NATIVE, [])


def test_a_missing_piece_is_named():
    trainer, masked, profiles = release("chunked")
    del masked.MaskedDiffusionProfile._token_ids
    assert detect.recognise(trainer, masked, profiles) == (None, ["MaskedDiffusionProfile._token_ids"])

    trainer, masked, profiles = release("native")
    del trainer.DiffusionTrainer._uses_global_masked_tokens
    assert detect.recognise(trainer, masked, profiles) == (None, ["DiffusionTrainer._uses_global_masked_tokens"])

    trainer, masked, profiles = release("dense")
    del masked.response_mask
    shape, missing = detect.recognise(trainer, masked, profiles)
    assert shape is None and "unsloth.models.diffusion_masked.response_mask" in missing


def test_an_unknown_variation_of_a_patched_shape_is_not_guessed():
    trainer, masked, profiles = release("chunked")
    trainer.DiffusionTrainer.get_batch_samples = lambda self, it, n, device=None: None  # but no prepare_batch
    shape, missing = detect.recognise(trainer, masked, profiles)
    assert shape is None and missing == ["no DiffusionTrainer.get_batch_samples of Unsloth's own"]

    trainer, masked, profiles = release("chunked")
    profiles.diffusion_profiles()[0].loss_normalization = "global_masked_tokens"  # fixed, but not the native shape
    assert detect.recognise(trainer, masked, profiles)[0] is None


def test_missing_classes_are_named_first():
    trainer, masked, profiles = release("dense")
    del trainer.DiffusionConfig
    assert detect.recognise(trainer, masked, profiles) == (None, ["unsloth.models.diffusion_trainer.DiffusionConfig"])

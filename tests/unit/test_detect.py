"""Shape recognition by features, on stand-in modules shaped like each Unsloth release (no Unsloth here)."""

import dataclasses
from types import SimpleNamespace

import pytest

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
    assert detect.recognise(*release("native")) == (detect.UPSTREAM, [])


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


def _drop_field(cls, name):
    cls.__dataclass_fields__ = {k: v for k, v in cls.__dataclass_fields__.items() if k != name}


def _not_a_dataclass(trainer, masked, profiles):
    trainer.DiffusionConfig = type("DiffusionConfig", (), {})


# Each check of each shape, broken alone: (shape, how, the one name recognise() must report).
BREAKS = [
    ("chunked", lambda t, m, p: delattr(t.DiffusionTrainer, "compute_loss"), "DiffusionTrainer.compute_loss"),
    ("chunked", _not_a_dataclass, "DiffusionConfig as a dataclass"),
    (
        "chunked",
        lambda t, m, p: delattr(m.MaskedDiffusionProfile, "compute_loss"),
        "MaskedDiffusionProfile.compute_loss",
    ),
    ("chunked", lambda t, m, p: delattr(m.MaskedDiffusionProfile, "option"), "MaskedDiffusionProfile.option"),
    *(
        ("chunked", lambda t, m, p, f=f: _drop_field(m.MaskedDiffusionProfile, f), f"MaskedDiffusionProfile.{f}")
        for f in ("pad_with_eos", "shift_logits", "loss_normalization")
    ),
    (
        "chunked",
        lambda t, m, p: setattr(t.DiffusionTrainer, "model_accepts_loss_kwargs", False),
        "the model_accepts_loss_kwargs=False rescale",
    ),
    (
        "chunked",
        lambda t, m, p: setattr(p.diffusion_profiles()[0], "loss_normalization", "answer_length"),
        "the nemotron_labs_diffusion profile normalized per micro-batch by masked tokens",
    ),
    (
        "chunked",
        lambda t, m, p: setattr(p, "diffusion_profiles", lambda: []),
        "the nemotron_labs_diffusion profile normalized per micro-batch by masked tokens",
    ),
    (
        "native",
        lambda t, m, p: _drop_field(m.MaskedDiffusionProfile, "loss_normalization"),
        "MaskedDiffusionProfile.loss_normalization",
    ),
    ("native", _not_a_dataclass, "DiffusionConfig as a dataclass"),
    ("native", lambda t, m, p: delattr(t, "DiffusionTrainer"), "unsloth.models.diffusion_trainer.DiffusionTrainer"),
    (
        "dense",
        lambda t, m, p: delattr(m, "MaskedDiffusionProfile"),
        "unsloth.models.diffusion_masked.MaskedDiffusionProfile",
    ),
]


@pytest.mark.parametrize("shape, drift, name", BREAKS, ids=[f"{s}: {n}" for s, _, n in BREAKS])
def test_every_check_names_exactly_what_is_missing(shape, drift, name):
    modules = release(shape)
    drift(*modules)
    assert detect.recognise(*modules) == (None, [name])


def test_a_release_with_neither_loss_names_every_piece_of_both():
    trainer, masked, profiles = release("dense")
    del masked.F, masked.response_mask
    assert detect.recognise(trainer, masked, profiles) == (
        None,
        ["unsloth.models.diffusion_masked." + n for n in dict.fromkeys(detect.CHUNKED_NAMES + detect.DENSE_NAMES)],
    )


def test_a_release_with_part_of_a_loss_names_only_what_is_missing():
    trainer, masked, profiles = release("chunked")
    del masked.compile_loss
    assert detect.recognise(trainer, masked, profiles) == (
        None,
        ["unsloth.models.diffusion_masked.compile_loss", "unsloth.models.diffusion_masked.F"],
    )


@pytest.mark.parametrize("shape", ["chunked", "native"])
def test_a_profile_class_that_is_not_a_dataclass_is_named_not_crashed_on(shape):
    trainer, masked, profiles = release(shape)
    plain = type(
        "MaskedDiffusionProfile",
        (),
        {
            k: v
            for k, v in vars(masked.MaskedDiffusionProfile).items()
            if k not in ("__dataclass_fields__", "__dict__", "__weakref__")
        },
    )
    masked.MaskedDiffusionProfile = plain
    shape_found, missing = detect.recognise(trainer, masked, profiles)
    assert shape_found is None and "MaskedDiffusionProfile.loss_normalization" in missing

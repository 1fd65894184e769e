"""Which code shape of Unsloth's diffusion trainer is installed, decided by features, not version strings."""

from importlib import metadata

# Code shapes (not modes: registry.NATIVE is the mode the UPSTREAM shape puts the plugin in).
DENSE = "dense-ce"  # 2026.10.4, .5: inline noise, F.cross_entropy on dense logits, trainer on SFTTrainer
CHUNKED = "chunked-ce"  # 2026.10.6: inline noise, chunked cross-entropy with a fusable head
UPSTREAM = "native-window"  # 2026.10.7+: prepare_batch + a window-counting get_batch_samples upstream

NEMOTRON = "nemotron_labs_diffusion"
# Names each shape's loss takes from unsloth.models.diffusion_masked.
DENSE_NAMES = ("F", "response_mask")
CHUNKED_NAMES = (
    "response_mask",
    "chunked_cross_entropy",
    "compile_loss",
    "fusable_head",
    "head_returns_hidden",
    "unwrap_diffusion_model",
)


def unsloth_version():
    try:
        return metadata.version("unsloth")
    except metadata.PackageNotFoundError:
        return None


def find_profile(profiles_module, name):
    for profile in profiles_module.diffusion_profiles():
        if profile.name == name:
            return profile
    return None


def recognise(trainer_module, masked_module, profiles_module):
    """(shape, missing): the recognised shape, or None and the list of pieces that were not found."""
    trainer = getattr(trainer_module, "DiffusionTrainer", None)
    config = getattr(trainer_module, "DiffusionConfig", None)
    profile_class = getattr(masked_module, "MaskedDiffusionProfile", None)
    missing = [
        name
        for name, found in (
            ("unsloth.models.diffusion_trainer.DiffusionTrainer", trainer),
            ("unsloth.models.diffusion_trainer.DiffusionConfig", config),
            ("unsloth.models.diffusion_masked.MaskedDiffusionProfile", profile_class),
        )
        if found is None
    ]
    if missing:
        return None, missing

    if hasattr(profile_class, "prepare_batch") and "get_batch_samples" in vars(trainer):
        # What the flag needs there: upstream's switch and the trainer's reading of it.
        checks = [
            ("DiffusionTrainer._uses_global_masked_tokens", hasattr(trainer, "_uses_global_masked_tokens")),
            (
                "MaskedDiffusionProfile.loss_normalization",
                "loss_normalization" in getattr(profile_class, "__dataclass_fields__", {}),
            ),
            ("DiffusionConfig as a dataclass", hasattr(config, "__dataclass_fields__")),
        ]
        missing = [name for name, ok in checks if not ok]
        return (None, missing) if missing else (UPSTREAM, [])

    fields = getattr(profile_class, "__dataclass_fields__", {})
    checks = [
        ("DiffusionTrainer.compute_loss", "compute_loss" in vars(trainer)),
        ("DiffusionConfig as a dataclass", hasattr(config, "__dataclass_fields__")),
        ("MaskedDiffusionProfile.compute_loss", "compute_loss" in vars(profile_class)),
        ("MaskedDiffusionProfile._token_ids", hasattr(profile_class, "_token_ids")),
        ("MaskedDiffusionProfile.option", hasattr(profile_class, "option")),
        *((f"MaskedDiffusionProfile.{f}", f in fields) for f in ("pad_with_eos", "shift_logits", "loss_normalization")),
        # We add window counting; a get_batch_samples of Unsloth's own would be a shape we do not know.
        ("no DiffusionTrainer.get_batch_samples of Unsloth's own", "get_batch_samples" not in vars(trainer)),
        ("the model_accepts_loss_kwargs=False rescale", "model_accepts_loss_kwargs" not in vars(trainer)),
    ]
    nemotron = find_profile(profiles_module, NEMOTRON)
    checks.append(
        (
            f"the {NEMOTRON} profile normalized per micro-batch by masked tokens",
            isinstance(nemotron, profile_class) and nemotron.loss_normalization == "masked_tokens",
        )
    )
    missing = [name for name, ok in checks if not ok]
    if not missing:
        if all(hasattr(masked_module, n) for n in CHUNKED_NAMES):
            return CHUNKED, []
        if all(hasattr(masked_module, n) for n in DENSE_NAMES):
            return DENSE, []
        missing = [
            "unsloth.models.diffusion_masked." + n
            for n in dict.fromkeys(CHUNKED_NAMES + DENSE_NAMES)
            if not hasattr(masked_module, n)
        ]
    return None, missing

"""The per-run flags: validation with a clear message, and what each value means per profile."""

from types import SimpleNamespace

import pytest

from unsloth_diffusion_norm import config


@pytest.mark.parametrize(
    "field, good, bad",
    [
        (config.FIELD, ("window", "microbatch", None), ("global", "Window", 1, "")),
        (config.NOISE_FIELD, ("global", "per_sample", None), ("per-sample", "window", 0)),
    ],
)
def test_validate_accepts_the_choices_and_names_them_otherwise(field, good, bad):
    for value in good:
        assert config.validate(value, field) == value
    for value in bad:
        with pytest.raises(ValueError, match=rf"{field} must be .* or None \(the default\), got {value!r}"):
            config.validate(value, field)


def profile(normalization):
    return SimpleNamespace(loss_normalization=normalization)


def args(value=None):
    return SimpleNamespace(**{config.FIELD: value})


def test_effective_normalization():
    assert config.effective(profile(config.GLOBAL_MASKED_TOKENS), args()) == config.WINDOW
    assert config.effective(profile(config.MASKED_TOKENS), args()) == config.MICROBATCH
    assert config.effective(profile("answer_length"), args()) == config.MICROBATCH
    assert config.effective(profile(config.MASKED_TOKENS), args("window")) == config.WINDOW
    assert config.effective(profile(config.GLOBAL_MASKED_TOKENS), args("microbatch")) == config.MICROBATCH
    assert config.effective(object(), None) == config.MICROBATCH  # nothing known: the release's own


def test_native_normalization_maps_the_flag_onto_upstreams_setting():
    native = config.native_normalization
    assert native(profile(config.GLOBAL_MASKED_TOKENS), args()) == config.GLOBAL_MASKED_TOKENS
    assert native(profile(config.GLOBAL_MASKED_TOKENS), args("microbatch")) == config.MASKED_TOKENS
    assert native(profile("answer_length"), args("microbatch")) == "answer_length"
    assert native(profile("answer_length"), args("window")) == config.GLOBAL_MASKED_TOKENS
    assert native(profile(None), args("window")) is None
    # A profile or arguments without the attribute (a non-masked profile; a config of another trainer).
    assert native(object(), args("window")) is None and native(profile("answer_length"), object()) == "answer_length"


def test_a_command_lines_value_goes_through_the_fields_parser_with_argparses_one_line():
    import argparse

    parse = config.argument_type(config.SAMPLER_FIELD)
    assert parse("stratified") == "stratified" and parse("None") is None
    with pytest.raises(argparse.ArgumentTypeError) as error:
        parse("sobol")
    assert str(error.value) == "diffusion_t_sampler must be 'stratified' or None (the default), got 'sobol'."
    draws = config.argument_type(config.EVAL_DRAWS_FIELD)
    assert draws("4") == 4 and draws(" +3 ") == 3
    for bad in ("-1", "0", "X3", "3-", "two"):  # each one argparse line, never a ValueError of int()
        with pytest.raises(argparse.ArgumentTypeError, match="diffusion_eval_draws must be a whole number"):
            draws(bad)


def test_the_pairs_flag_takes_a_command_lines_true_and_false_in_any_case():
    """HfArgumentParser hands a bool field's "True" / "false" to the field's parser as text; YAML may too."""
    field = config.COMPLEMENTARY_FIELD
    for text, value in (("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False)):
        assert config.validate(text, field) is value, text
    assert config.validate(True, field) is True and config.validate(None, field) is False
    for bad in ("yes", "1", 1, "truex"):
        with pytest.raises(ValueError, match=rf"{field} must be True or False \(the default\), got {bad!r}"):
            config.validate(bad, field)


def test_a_negative_draw_count_on_the_command_line_is_named_as_the_number_it_is():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as error:
        config.argument_type(config.EVAL_DRAWS_FIELD)(" -2")
    assert str(error.value) == ("diffusion_eval_draws must be a whole number of draws, 1 or more (default 1), got -2.")


def test_several_evaluation_draws_alone_are_refused_and_need_fixed_evaluation_noise():
    draws = config.EVAL_DRAWS_FIELD
    for asked in (SimpleNamespace(**{draws: 3}), SimpleNamespace(**{draws: 3, config.EVAL_NOISE_FIELD: None})):
        with pytest.raises(ValueError, match=rf"{draws}=3 averages keyed evaluation draws; set "):
            config.check_together(asked)
    config.check_together(SimpleNamespace(**{draws: 3, config.EVAL_NOISE_FIELD: config.FIXED}))
    config.check_together(SimpleNamespace())  # another trainer's config: nothing to check


def test_eval_draws_is_one_unless_a_run_asks_for_more():
    assert config.eval_draws(SimpleNamespace()) == 1  # another trainer's config: no field
    assert config.eval_draws(SimpleNamespace(diffusion_eval_draws=None)) == 1
    assert config.eval_draws(SimpleNamespace(diffusion_eval_draws=3)) == 3


def test_the_construction_note_names_where_the_noise_comes_from_only_when_the_run_did_not_say():
    """Per-sample noise the model config asked for (the field unset) is named; per-sample noise the run set
    itself is not; global noise is named only where ranks can draw alike (more than one)."""

    def note(mode, world_size, field=None):
        return config.noise_note(SimpleNamespace(**{config.NOISE_FIELD: field}, world_size=world_size), mode)

    assert note(config.PER_SAMPLE, 1) == (
        "unsloth_diffusion_norm: the model's config sets dp_varying_mask_ratio=True, so every example draws its own "
        "noise (diffusion_noise='per_sample'); diffusion_noise='global' keeps the global RNG's draws."
    )
    assert note(config.PER_SAMPLE, 2) == note(config.PER_SAMPLE, 1)
    assert note(config.PER_SAMPLE, 1, field=config.PER_SAMPLE) is None
    assert note(config.PER_SAMPLE, 2, field=config.PER_SAMPLE) is None
    assert note(config.GLOBAL, 1) is None and note(config.GLOBAL, 1, field=config.GLOBAL) is None
    assert note(config.GLOBAL, 2) == (
        "unsloth_diffusion_norm: the noise comes from the global RNG, seeded alike on all 2 data-parallel ranks, so "
        "every rank draws the same noise levels; diffusion_noise='per_sample' gives each example its own."
    )
    assert "on all 3 data-parallel ranks" in note(config.GLOBAL, 3, field=config.GLOBAL)


def test_the_noise_is_the_runs_field_else_the_model_configs_switch_else_global():
    """The field when set; unset or absent (a namespace of some fields only), the model config's
    dp_varying_mask_ratio when it is exactly True; a config without the switch, or no config, draws globally."""
    unset, absent = SimpleNamespace(**{config.NOISE_FIELD: None}), SimpleNamespace()
    varying, fixed, other = (SimpleNamespace(**{config.DP_VARYING: v}) for v in (True, False, 1))
    for args in (unset, absent):
        assert config.effective_noise(args, varying) == config.PER_SAMPLE
        for model_config in (fixed, other, SimpleNamespace(), None):
            assert config.effective_noise(args, model_config) == config.GLOBAL
    for value in (config.GLOBAL, config.PER_SAMPLE):
        for model_config in (varying, fixed, None):
            assert config.effective_noise(SimpleNamespace(**{config.NOISE_FIELD: value}), model_config) == value

"""The per-run flags: validation with a clear message, and what each value means per profile."""

from types import SimpleNamespace

import pytest

from unsloth_diffusion_norm import config


@pytest.mark.parametrize(
    "field, good, bad",
    [
        (config.NORMALIZATION.name, ("window", "microbatch", None), ("global", "Window", 1, "")),
        (config.NOISE.name, ("global", "per_sample", None), ("per-sample", "window", 0)),
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
    return SimpleNamespace(**{config.NORMALIZATION.name: value})


def test_effective_normalization():
    assert config.normalization_for(profile(config.GLOBAL_MASKED_TOKENS), args()) == config.WINDOW
    assert config.normalization_for(profile(config.MASKED_TOKENS), args()) == config.MICROBATCH
    assert config.normalization_for(profile("answer_length"), args()) == config.MICROBATCH
    assert config.normalization_for(profile(config.MASKED_TOKENS), args("window")) == config.WINDOW
    assert config.normalization_for(profile(config.GLOBAL_MASKED_TOKENS), args("microbatch")) == config.MICROBATCH
    assert config.normalization_for(object(), None) == config.MICROBATCH  # nothing known: the release's own


def test_native_normalization_maps_the_flag_onto_upstreams_setting():
    native = config.upstream_normalization_for
    assert native(profile(config.GLOBAL_MASKED_TOKENS), args()) == config.GLOBAL_MASKED_TOKENS
    assert native(profile(config.GLOBAL_MASKED_TOKENS), args("microbatch")) == config.MASKED_TOKENS
    assert native(profile("answer_length"), args("microbatch")) == "answer_length"
    assert native(profile("answer_length"), args("window")) == config.GLOBAL_MASKED_TOKENS
    assert native(profile(None), args("window")) is None
    # A profile or arguments without the attribute (a non-masked profile; a config of another trainer).
    assert native(object(), args("window")) is None and native(profile("answer_length"), object()) == "answer_length"


def test_a_command_lines_value_goes_through_the_fields_parser_with_argparses_one_line():
    import argparse

    parse = config.argument_type(config.T_SAMPLER.name)
    assert parse("stratified") == "stratified" and parse("None") is None
    with pytest.raises(argparse.ArgumentTypeError) as error:
        parse("sobol")
    assert str(error.value) == "diffusion_t_sampler must be 'stratified' or None (the default), got 'sobol'."
    draws = config.argument_type(config.EVAL_DRAWS.name)
    assert draws("4") == 4 and draws(" +3 ") == 3
    for bad in ("-1", "0", "X3", "3-", "two"):  # each one argparse line, never a ValueError of int()
        with pytest.raises(argparse.ArgumentTypeError, match="diffusion_eval_draws must be a whole number"):
            draws(bad)


def test_the_pairs_flag_takes_a_command_lines_true_and_false_in_any_case():
    """HfArgumentParser hands a bool field's "True" / "false" to the field's parser as text; YAML may too."""
    field = config.COMPLEMENTARY.name
    for text, value in (("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False)):
        assert config.validate(text, field) is value, text
    assert config.validate(True, field) is True and config.validate(None, field) is False
    for bad in ("yes", "1", 1, "truex"):
        with pytest.raises(ValueError, match=rf"{field} must be True or False \(the default\), got {bad!r}"):
            config.validate(bad, field)


def test_a_negative_draw_count_on_the_command_line_is_named_as_the_number_it_is():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as error:
        config.argument_type(config.EVAL_DRAWS.name)(" -2")
    assert str(error.value) == ("diffusion_eval_draws must be a whole number of draws, 1 or more (default 1), got -2.")


def test_several_evaluation_draws_alone_are_refused_and_need_fixed_evaluation_noise():
    draws = config.EVAL_DRAWS.name
    for asked in (SimpleNamespace(**{draws: 3}), SimpleNamespace(**{draws: 3, config.EVAL_NOISE.name: None})):
        with pytest.raises(ValueError, match=rf"{draws}=3 averages keyed evaluation draws; set "):
            config.check_together(asked)
    config.check_together(SimpleNamespace(**{draws: 3, config.EVAL_NOISE.name: config.FIXED}))
    config.check_together(SimpleNamespace())  # another trainer's config: nothing to check


def test_eval_draws_is_one_unless_a_run_asks_for_more():
    assert config.EVAL_DRAWS.of(SimpleNamespace()) == 1  # another trainer's config: no field
    assert config.EVAL_DRAWS.of(SimpleNamespace(diffusion_eval_draws=None)) == 1
    assert config.EVAL_DRAWS.of(SimpleNamespace(diffusion_eval_draws=3)) == 3


def test_the_construction_note_names_where_the_noise_comes_from_only_when_the_run_did_not_say():
    """Per-sample noise the model config asked for (the field unset) is named; per-sample noise the run set
    itself is not; global noise is named only where ranks can draw alike (more than one)."""

    def note(mode, world_size, field=None):
        return config.noise_note(SimpleNamespace(**{config.NOISE.name: field}, world_size=world_size), mode)

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
    unset, absent = SimpleNamespace(**{config.NOISE.name: None}), SimpleNamespace()
    varying, fixed, other = (SimpleNamespace(**{config.DP_VARYING: v}) for v in (True, False, 1))
    for args in (unset, absent):
        assert config.noise_for(args, varying) == config.PER_SAMPLE
        for model_config in (fixed, other, SimpleNamespace(), None):
            assert config.noise_for(args, model_config) == config.GLOBAL
    for value in (config.GLOBAL, config.PER_SAMPLE):
        for model_config in (varying, fixed, None):
            assert config.noise_for(SimpleNamespace(**{config.NOISE.name: value}), model_config) == value


def test_the_flags_table_of_the_api_page_is_the_flags_records():
    """docs/api.md's flags table is rendered from config.FLAGS, the one place each flag is defined: a flag added,
    renamed or re-explained there shows here (paste the rendered table between the markers)."""
    import pathlib

    from unsloth_diffusion_norm.proof import tables

    page = (pathlib.Path(__file__).parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    block = page.split("<!-- flags: start")[1].split("<!-- flags: end -->")[0].split("\n", 1)[1].strip("\n")
    assert block.splitlines() == tables.flags_table(), "\n".join(tables.flags_table())


def test_each_flag_is_one_record_and_everything_that_lists_flags_derives_from_it():
    """The Fields dataclass (what DiffusionConfig gets), validation and status()'s defaults line, from FLAGS."""
    import dataclasses
    import typing

    assert list(config.FIELDS) == [flag.name for flag in config.FLAGS]
    fields = {field.name: field for field in dataclasses.fields(config.Fields)}
    assert list(fields) == list(config.FIELDS)
    hints = typing.get_type_hints(config.Fields)  # what HfArgumentParser / TrlParser read
    for flag in config.FLAGS:
        assert fields[flag.name].default == flag.default == config.default(flag.name)
        assert fields[flag.name].metadata["help"] == flag.help
        parse = typing.get_args(hints[flag.name])[0] if flag.default is None else hints[flag.name]
        if typing.get_origin(parse) is list:  # a list of texts: the parser converts each element
            parse = typing.get_args(parse)[0]
        assert parse.__name__ == flag.name and parse("None") == flag.default
        assert config.validate(None, flag.name) == flag.default
    for mode in ("patched", "native"):
        line = config.defaults_line(mode)
        assert all(f"{flag.name}={flag.default!r}: {flag.gives(mode)}" in line for flag in config.FLAGS)
        assert line.endswith(
            "opt-ins per run: diffusion_loss_normalization='window' or 'microbatch', diffusion_noise='global' or "
            "'per_sample', diffusion_eval_noise='fixed', diffusion_eval_draws=K, diffusion_eval_buckets=B, "
            "diffusion_t_sampler='stratified', "
            "diffusion_complementary_masks=True, diffusion_metrics=False, diffusion_eval_samples=N, "
            "diffusion_eval_sample_prompts=['...', ...], diffusion_paradigm='bidirectional' or 'block_diff', "
            "diffusion_ar_loss_alpha=a"
        )


def test_what_a_run_gets_by_default_is_said_per_mode_from_the_records():
    """The defaults line starts with the first flag's default and what it gives in that mode, '; ' between flags;
    a switch reads as True or False; report.defaults says it for the modes that patch, the disabled plugin's own
    line when switched off, and nothing otherwise."""
    from unsloth_diffusion_norm import registry, report

    assert config.NORMALIZATION.gives("patched") == "each profile's own (Nemotron: window)"
    assert config.NORMALIZATION.gives("native") == "Unsloth's own loss (window-normalized natively)"
    assert config.COMPLEMENTARY.gives("native") == "one mask per example"
    assert config.defaults_line("patched").startswith(
        "diffusion_loss_normalization=None: each profile's own (Nemotron: window); diffusion_noise=None: 'global'"
    )
    assert config.COMPLEMENTARY.of(SimpleNamespace(diffusion_complementary_masks=1)) is True
    assert config.COMPLEMENTARY.of(SimpleNamespace()) is False
    assert report.defaults(registry.PATCHED) == config.defaults_line("patched")
    assert report.defaults(registry.NATIVE) == config.defaults_line("native")
    assert report.defaults(registry.DISABLED) == report.DISABLED_DEFAULTS
    for mode in (registry.PENDING, registry.UNPATCHED, registry.UNSUPPORTED, registry.BROKEN):
        assert report.defaults(mode) is None


def test_a_bad_bucket_count_is_one_line_and_buckets_need_fixed_evaluation_noise():
    import argparse

    buckets = config.EVAL_BUCKETS.name
    parse = config.argument_type(buckets)
    assert parse("3") == 3 and parse("None") == 5 and config.EVAL_BUCKETS.of(SimpleNamespace()) == 5
    for bad in ("0", "-4", "2.5", "many"):
        with pytest.raises(argparse.ArgumentTypeError) as error:
            parse(bad)
        assert str(error.value).startswith(f"{buckets} must be a whole number of buckets, 1 or more (default 5), got ")
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=rf"{buckets} must be a whole number of buckets"):
            config.validate(bad, buckets)
    with pytest.raises(ValueError, match=rf"{buckets}=3 buckets keyed evaluation draws; set diffusion_eval_noise="):
        config.check_together(SimpleNamespace(**{buckets: 3}))
    config.check_together(SimpleNamespace(**{buckets: 3, config.EVAL_NOISE.name: config.FIXED}))
    config.check_together(SimpleNamespace(**{buckets: 5}))  # the default: nothing asked


def test_samples_take_a_count_of_one_or_more_and_need_a_run_that_evaluates():
    import argparse

    samples = config.EVAL_SAMPLES.name
    parse = config.argument_type(samples)
    assert parse("2") == 2 and parse("None") is None and config.EVAL_SAMPLES.of(SimpleNamespace()) is None
    for bad in ("0", "-1", "some"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"{samples} must be a whole number of samples, 1 or more"):
            parse(bad)
    for strategy in ("no", SimpleNamespace(value="no")):  # (TrainingArguments holds an IntervalStrategy)
        with pytest.raises(ValueError, match=rf"{samples}=3 decodes samples at each evaluation, and this run never"):
            config.check_samples(SimpleNamespace(**{samples: 3, "eval_strategy": strategy}))
    config.check_samples(SimpleNamespace(**{samples: 3, "eval_strategy": "steps"}))
    config.check_samples(SimpleNamespace(eval_strategy="no"))  # none asked


def test_prompts_of_ones_own_are_a_list_of_texts_from_yaml_or_a_command_line_and_not_beside_a_count():
    import argparse

    prompts = config.SAMPLE_PROMPTS.name
    assert config.validate(["Say hi.", "Count to 3."], prompts) == ["Say hi.", "Count to 3."]
    assert config.validate(None, prompts) is None and config.validate([None], prompts) is None  # "None": reset
    for bad in ([], [""], ["  "], "Say hi.", [3], ["ok", None]):
        with pytest.raises(ValueError, match=rf"{prompts} must be a list of one or more non-empty texts, got "):
            config.validate(bad, prompts)
    parse = config.argument_type(prompts)
    assert parse("Say hi.") == "Say hi." and parse("None") is None
    with pytest.raises(argparse.ArgumentTypeError, match=f"{prompts} takes non-empty texts, got ''"):
        parse("")
    both = SimpleNamespace(**{prompts: ["Say hi."], config.EVAL_SAMPLES.name: 2, "eval_strategy": "steps"})
    with pytest.raises(ValueError, match="give one of them"):
        config.check_samples(both)
    with pytest.raises(ValueError, match=rf"{prompts}=\['Say hi.'\] decodes samples at each evaluation"):
        config.check_samples(SimpleNamespace(**{prompts: ["Say hi."], "eval_strategy": "no"}))


def test_the_ar_alpha_is_a_finite_number_of_0_or_more_from_python_yaml_or_a_command_line():
    import argparse

    alpha = config.AR_ALPHA.name
    parse = config.argument_type(alpha)
    assert parse("0.5") == 0.5 and parse("1") == 1.0 and parse("None") == 0.3
    assert config.AR_ALPHA.of(SimpleNamespace()) == 0.3 and config.validate(0, alpha) == 0.0
    for bad in ("-0.1", "inf", "nan", "a lot"):
        with pytest.raises(argparse.ArgumentTypeError) as error:
            parse(bad)
        assert str(error.value).startswith(f"{alpha} must be a finite number, 0 or more (default 0.3), got ")
    for bad in (True, -1, float("inf"), "0.5"):
        with pytest.raises(ValueError, match=rf"{alpha} must be a finite number"):
            config.validate(bad, alpha)


def test_a_paradigm_the_models_class_cannot_switch_to_is_refused_in_one_line():
    import torch

    from unsloth_diffusion_norm import block_attention

    plain = SimpleNamespace(dlm_paradigm="bidirectional")
    with pytest.raises(ValueError) as refused:
        block_attention.patches(torch.nn.Linear(2, 2), plain, config.BLOCK_DIFF, 4)
    message = str(refused.value)
    assert (
        "\n" not in message and "diffusion_paradigm='block_diff'" in message and block_attention.FLEX_CLASS in message
    )
    assert block_attention.patches(torch.nn.Linear(2, 2), plain, config.BIDIRECTIONAL, 4) == []  # nothing asked

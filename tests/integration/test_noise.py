"""Noise you can trust: a run resumed from a checkpoint draws the same masks as the uninterrupted run."""

import contextlib
import types

import pytest
import torch

import unsloth_diffusion_norm
from unsloth_diffusion_norm import detect, registry
from unsloth_diffusion_norm.proof import experiment, judging
from unsloth_diffusion_norm.proof.fixtures import equal_answers

MODE = unsloth_diffusion_norm.apply().mode
EXAMPLES = equal_answers(8)  # GA 2: 4 steps


@pytest.mark.parametrize("normalization", [None, "microbatch"])
def test_resumed_run_is_bitwise_the_uninterrupted_one(plugin, normalization):
    flag = {} if normalization is None else {"diffusion_loss_normalization": normalization}
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


def test_found_by_the_fuzzer_a_resumed_partial_last_window_is_stepped_as_the_release_s_trainer_steps_it(plugin):
    """Found by the fuzzer on transformers 4.56: resumed mid-epoch, its Trainer never steps the epoch's partial last
    window, with or without the plugin (docs/limits.md). With the plugin, the resumed run steps it exactly where
    Trainer does with the plugin off, and the steps it takes are bitwise the uninterrupted run's."""
    from unsloth_diffusion_norm.proof import fixtures

    runs = experiment.train_and_resume(fixtures.answers(fixtures.LONG, 5), 1, gradient_accumulation_steps=2, seed=0)
    assert [len(w.batches) for w in runs.full.windows] == [2, 2, 1] and len(runs.resumed.windows) == 2
    stepped = runs.resumed.windows[-1].params_after is not None
    assert stepped == experiment.resumed_trainer_steps_a_partial_last_window()
    import transformers

    assert stepped or int(transformers.__version__.split(".")[0]) < 5  # (5.x steps it)
    whole = runs.resumed.windows[0].params_after, runs.full.windows[1].params_after
    assert all(torch.equal(whole[0][name], whole[1][name]) for name in whole[1])
    assert not stepped or runs.difference == 0.0


def test_per_sample_noise_differs_between_examples_and_seeds(plugin):
    """Each example its own level, another seed other levels; and the window's metrics are logged from those
    draws (on a natively fixed release, the ones its own fetch drew) as the oracle computes them."""
    first = experiment.train(EXAMPLES, seed=0, diffusion_noise="per_sample")
    verdicts = [judging.judge(first, window) for window in first.windows]
    assert all(v.ok and v.metrics_error is not None for v in verdicts), verdicts
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
def test_native_default_is_resume_exact_and_an_uninterrupted_run_is_bitwise_unsloths_own(plugin):
    """What the default fixes there, measured: Unsloth's own draws (unpatched), made while fetching, differ
    after a resume; the default draws the same noise at the window's first step - bitwise Unsloth's own run
    when nothing is resumed, and the same as asking for diffusion_noise="global"."""
    with unsloth_diffusion_norm.unpatched():
        assert experiment.train_and_resume(EXAMPLES, at=2, seed=0).difference > 1e-3
        own = experiment.train(EXAMPLES, seed=0)
    assert experiment.train_and_resume(EXAMPLES, at=2, seed=0).difference == 0.0
    default = experiment.train(EXAMPLES, seed=0)
    asked = experiment.train(EXAMPLES, seed=0, diffusion_noise="global")
    assert experiment.divergence(default, own) == experiment.divergence(asked, own) == 0.0
    assert "compute_loss" in vars(default.trainer.diffusion_profile)  # the trainer's own profile copy draws


NOTE_PER_SAMPLE = (
    "unsloth_diffusion_norm: the model's config sets dp_varying_mask_ratio=True, so every example draws its own "
    "noise (diffusion_noise='per_sample'); diffusion_noise='global' keeps the global RNG's draws."
)


def test_nvidias_dp_varying_mask_ratio_asks_for_per_sample_noise_in_one_line(plugin, tmp_path, caplog):
    """The model config's switch (NVIDIA's default: False) with diffusion_noise at None: per-sample noise,
    said once when the trainer is built, not per step; an explicit diffusion_noise wins, silently."""
    import logging

    from unsloth_diffusion_norm.proof.fixtures import write_tiny_checkpoint

    varying = write_tiny_checkpoint(str(tmp_path / "varying"), dp_varying_mask_ratio=True)
    with caplog.at_level(logging.INFO, logger="unsloth_diffusion_norm"):
        run = experiment.train(EXAMPLES[:6], seed=0, checkpoint=varying)  # 3 steps
        said = [record.getMessage() for record in caplog.records if record.name == "unsloth_diffusion_norm"]
        assert said == [NOTE_PER_SAMPLE]
        caplog.clear()
        keys = [batch.get("keys") for window in run.windows for batch in window.batches]
        assert len(keys) == 6 and all(keys)  # really per sample
        assert all(judging.judge(run, window).ok for window in run.windows)
        asked = experiment.train(EXAMPLES[:6], seed=0, checkpoint=varying, diffusion_noise="global")
        own = experiment.train(EXAMPLES[:6], seed=0)  # NVIDIA's default, False: the global draws
        assert not [record for record in caplog.records if record.name == "unsloth_diffusion_norm"]
    assert all(batch.get("keys") is None for window in asked.windows for batch in window.batches)
    assert experiment.divergence(asked, own) == 0.0  # (the same weights: only the config field differs)


@pytest.mark.skipif(MODE != registry.NATIVE, reason="the undrawn fetch stands in for 2026.10.7+'s own")
def test_the_undrawn_fetch_takes_its_arguments_by_position_or_by_name_and_ends_as_the_releases_does(plugin):
    """Trainer fetches a window by position; another caller may name the arguments. The same rows either way,
    with the window their noise is drawn into at its first step; an exhausted iterator gives the release's
    ([], None)."""
    from unsloth_diffusion_norm.window import Window

    trainer = experiment.train(EXAMPLES[:4], seed=0).trainer
    loader = trainer.get_train_dataloader()
    fetched = [
        trainer.get_batch_samples(iter(loader), 2, None),
        trainer.get_batch_samples(epoch_iterator=iter(loader), num_batches=2, device=None),
    ]
    for batches, window in fetched:
        assert len(batches) == 2 and isinstance(window, Window)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(fetched[0][0], fetched[1][0], strict=True))
    assert trainer.get_batch_samples(iter([]), 2, None) == ([], None)
    assert trainer.get_batch_samples(epoch_iterator=iter([]), num_batches=2, device=None) == ([], None)


def test_the_model_config_is_found_where_the_release_finds_it(plugin):
    """dp_varying_mask_ratio is read from the config the release's DiffusionTrainer resolves its profile from: the
    model's own, else its base_model's (PEFT), else its module's (a wrapper); None when none has one."""
    from unsloth.models.diffusion_trainer import _unwrap_config

    from unsloth_diffusion_norm import construction

    own, base, inner = (types.SimpleNamespace(name=name) for name in ("own", "base", "inner"))
    bare = types.SimpleNamespace
    shapes = {
        "its own": bare(config=own, base_model=bare(config=base), module=bare(config=inner)),
        "its base_model's": bare(base_model=bare(config=base), module=bare(config=inner)),
        "its module's": bare(base_model=bare(), module=bare(config=inner)),
        "a None config passed over": bare(config=None, module=bare(config=inner)),
        "none": bare(base_model=bare(), module=bare()),
        "nothing to look in": bare(),
    }
    found = {name: construction.model_config(model) for name, model in shapes.items()}
    assert found == {name: _unwrap_config(model) for name, model in shapes.items()}
    assert [getattr(c, "name", None) for c in found.values()] == ["own", "base", "inner", "inner", None, None]


@pytest.mark.skipif(MODE == registry.NATIVE, reason="the patched releases' per-sample noise keeps the profile's")
def test_the_model_configs_switch_with_a_family_it_cannot_key_is_refused_in_its_words(plugin, tmp_path):
    """dp_varying_mask_ratio=True asks for per-sample noise, which LLaDA's own answer-length normalization cannot
    take on 2026.10.4-.6: the refusal names the switch, not a field the run never set, and the way out."""
    from unsloth.models.diffusion_profiles import diffusion_profiles

    from unsloth_diffusion_norm.proof.fixtures import write_tiny_checkpoint

    llada = next(p for p in diffusion_profiles() if p.name == "llada")
    varying = write_tiny_checkpoint(str(tmp_path / "varying"), dp_varying_mask_ratio=True)
    with pytest.raises(ValueError) as error:
        experiment.build(EXAMPLES[:2], experiment.Setup.of(checkpoint=varying, diffusion_profile=llada), record=False)
    assert str(error.value) == (
        "unsloth_diffusion_norm: the model config's dp_varying_mask_ratio=True (per-sample noise) with 'llada''s "
        "own 'answer_length' normalization is not available on this release; set diffusion_loss_normalization="
        "'window' or set diffusion_noise='global'."
    )


def test_a_runs_own_eps_and_weighting_reach_every_draw_and_loss(plugin):
    """Every noise path the plugin draws itself reads the run's settings: the oracle replays eps 0.3 and
    unweighted losses, window by window."""
    paths = ["per_sample", "global" if MODE == registry.NATIVE else None]
    for noise in paths:
        # (judged on gradients and parameters: transformers 4.56 logs a loss rounded to 4 decimals)
        run = experiment.train(
            EXAMPLES[:4],
            seed=0,
            diffusion_eps=0.3,
            diffusion_time_weighting="none",
            logging_steps=100,
            **({"diffusion_noise": noise} if noise else {}),
        )
        assert all(
            judging.judge(run, window, judging.OracleSettings(eps=0.3, inverse_t=False)).ok for window in run.windows
        ), noise


@pytest.mark.skipif(MODE != registry.NATIVE, reason="a natively fixed release")
@pytest.mark.parametrize("noise", ["global", "per_sample"])
def test_outside_training_a_flagged_trainers_profile_is_the_releases_own(plugin, noise):
    """Evaluation and direct calls (no window, no per-sample keys) reach the release's own code with what
    was passed: a trainer's profile copy answers as a clean profile with the same fields does."""
    import dataclasses

    setup = experiment.Setup.of(diffusion_noise=noise, diffusion_eps=0.3)  # (not the default)
    run = experiment.build(EXAMPLES[:2], setup, record=False)
    ours, model, args = run.trainer.diffusion_profile, run.trainer.model, run.trainer.args
    clean = dataclasses.replace(ours)  # (fields only: none of the trainer's patches)
    ids = torch.tensor([[10, 11, 30, 31, 32, 33]])
    inputs = {
        "input_ids": ids,
        "labels": torch.where(torch.arange(6) < 2, -100, ids),
        "attention_mask": torch.ones_like(ids),
    }

    def call(profile):
        torch.manual_seed(7)
        if noise == "global":  # a count passed by the caller is the release's to use
            return (profile.compute_loss(model, dict(inputs), args, num_items_in_batch=torch.tensor(5))[0].detach(),)
        return profile.prepare_batch(model, dict(inputs), args)

    assert "compute_loss" in vars(ours) or "prepare_batch" in vars(ours)  # the copy is patched
    found, expected = call(ours), call(clean)
    assert all(torch.equal(a, b) for a, b in zip(found, expected) if a is not None)
    assert [a is None for a in found] == [b is None for b in expected]


@pytest.fixture
def direct(tmp_path):
    """For direct calls of a profile: the tiny model, and `args(**settings)`: the run's arguments (fp32, CPU)."""
    from unsloth.models.diffusion_trainer import DiffusionConfig

    from unsloth_diffusion_norm.proof.fixtures import load_model

    def args(**settings):
        return DiffusionConfig(output_dir=str(tmp_path), bf16=False, fp16=False, use_cpu=True, **settings)

    return types.SimpleNamespace(model=load_model()[0], args=args)


def _profile(name, **changes):
    import dataclasses

    from unsloth.models.diffusion_profiles import diffusion_profiles

    profile = next(p for p in diffusion_profiles() if p.name == name)
    return dataclasses.replace(profile, **changes) if changes else profile


def _nemotron(**changes):
    return _profile("nemotron_labs_diffusion", **changes)


@pytest.mark.skipif(MODE != registry.PATCHED, reason="the patched compute_loss of an affected release")
@pytest.mark.parametrize(
    "variant",
    [
        "no attention mask",
        "padding attended, no EOS fill",
        "eps and mask id set",
        "a padded row without an answer",
        "a head with a bias",
        "one answer token",
        "dream, shifted logits",
        "nothing to mask",
        "an all-ones mask, no EOS fill",
        "the compiled loss",
        "keyword arguments, microbatch",
    ],
)
def test_a_direct_compute_loss_call_is_the_releases_own_bitwise(plugin, direct, variant):
    """Outside a training window (evaluation, a user's own call) the patched profile draws and divides as the
    release does: the same loss and metrics, bit for bit, for inputs the training cases never send - and
    it calls the model with the same inputs the release does."""
    model = direct.model
    ids = torch.tensor([[10, 11, 30, 31, 32, 33], [10, 11, 40, 41, 1, 1]])
    inputs = {
        "input_ids": ids,
        "labels": torch.where(torch.arange(6) < 2, -100, ids),
        "attention_mask": torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]]),
    }
    settings, changes, name = {}, {}, "nemotron_labs_diffusion"
    if variant == "no attention mask":
        del inputs["attention_mask"]
    elif variant == "padding attended, no EOS fill":  # (eps 0.9: nearly every answer token masked, both rows')
        changes, settings = {"pad_with_eos": False}, {"diffusion_eps": 0.9}
    elif variant == "eps and mask id set":
        settings = {"diffusion_eps": 0.25, "diffusion_mask_token_id": 3}
    elif variant == "a padded row without an answer":  # its EOS tail is not maskable; the other row's is
        inputs["labels"] = torch.stack([inputs["labels"][0], torch.full((6,), -100)])
        inputs["attention_mask"] = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
    elif variant == "a head with a bias":
        head = model.get_output_embeddings()
        head.bias = torch.nn.Parameter(torch.linspace(-1, 1, head.out_features))
    elif variant == "one answer token":  # the metrics' denominators at their floor
        inputs["labels"] = torch.full_like(ids, -100).index_put_((torch.tensor([0]), torch.tensor([5])), ids[0, 5])
        settings = {"diffusion_eps": 0.9}
    elif variant == "nothing to mask":  # no answer at all: a zero loss and the release's own early metrics
        inputs["labels"] = torch.full_like(ids, -100)
    elif variant == "an all-ones mask, no EOS fill":  # 2026.10.4 leaves a mask that masks nothing out of the call
        changes, inputs["attention_mask"] = {"pad_with_eos": False}, torch.ones_like(ids)
    elif variant == "the compiled loss":  # the release's compiled chunk kernels (checked below to differ from eager)
        if unsloth_diffusion_norm.status().shape != detect.CHUNKED:
            pytest.skip("the dense shape (2026.10.4 / .5) has no compiled loss")
        settings = {"diffusion_compile": "loss", "diffusion_eps": 0.9}
    elif variant == "keyword arguments, microbatch":  # the flag hands the call, as made, to the release
        settings = {"diffusion_loss_normalization": "microbatch"}
    else:  # Dream shifts its logits; the flag routes it through the plugin's loss (eps 0.9: the last token too)
        name, settings = "dream", {"diffusion_loss_normalization": "window", "diffusion_eps": 0.9}
    args = direct.args(**settings)
    calls = []
    model.register_forward_pre_hook(lambda _, pos, kw: calls.append((pos, dict(kw))), with_kwargs=True)

    def call():
        torch.manual_seed(7)
        profile, batch = _profile(name, **changes), dict(inputs)
        if variant.startswith("keyword"):
            loss, _, metrics = profile.compute_loss(model=model, inputs=batch, args=args, num_items_in_batch=None)
        else:
            loss, _, metrics = profile.compute_loss(model, batch, args)
        return loss.detach(), {k: float(v) for k, v in metrics.items()}

    patched = call()
    with unsloth_diffusion_norm.unpatched():
        own = call()
    assert torch.equal(patched[0], own[0]) and patched[1] == own[1]
    assert patched[0] == 0 if variant == "nothing to mask" else patched[0] > 0
    (ours, ours_kw), (theirs, theirs_kw) = calls
    assert ours == theirs == () and ours_kw.keys() == theirs_kw.keys()
    assert all(torch.equal(ours_kw[k], theirs_kw[k]) for k in ours_kw)
    if variant == "the compiled loss":  # eager kernels give other bits here: the equality above is the compiled path
        args = direct.args(diffusion_eps=0.9)
        assert not torch.equal(call()[0], patched[0])


@pytest.mark.skipif(MODE != registry.PATCHED, reason="the patched compute_loss of an affected release")
def test_a_window_scales_its_loss_for_data_parallel_and_refuses_a_micro_batch_without_its_slot(plugin, direct):
    """compute_loss with a window (what get_batch_samples hands Trainer): the loss is S / (the window's
    count) times the window's data-parallel factor; a micro-batch that bypassed get_batch_samples is refused."""
    from unsloth_diffusion_norm.batch_keys import SLOT
    from unsloth_diffusion_norm.window import Window

    model = direct.model
    ids = torch.tensor([[10, 11, 30, 31, 32, 33]])
    inputs = {
        "input_ids": ids,
        "labels": torch.where(torch.arange(6) < 2, -100, ids),
        "attention_mask": torch.ones_like(ids),
    }
    args = direct.args(diffusion_eps=0.25, diffusion_mask_token_id=3)  # (the window's draw reads them too)

    def loss(scale, others=0):  # others: masked tokens of the window's other micro-batches / ranks
        torch.manual_seed(7)
        window = Window([inputs], lambda count: count + others, scale)
        result = _nemotron().compute_loss(model, {**inputs, SLOT: 0}, args, num_items_in_batch=window)
        assert len(result) == 3 and result[1] is None and set(result[2]) == {"masked_fraction", "masked_ce"}
        return result[0].detach(), int(window.count)

    (one, count), (three, _), (shared, total) = loss(1), loss(2), loss(1, others=5)
    torch.manual_seed(7)
    direct = _nemotron().compute_loss(model, dict(inputs), args)[0].detach()
    assert count > 0 and torch.equal(one, direct)  # one micro-batch, one rank: its own count
    assert torch.equal(three, one * 2) and total == count + 5
    assert torch.allclose(shared * total, one * count, rtol=1e-6, atol=0)  # S / (the window's count)
    with pytest.raises(RuntimeError) as refused:
        _nemotron().compute_loss(model, dict(inputs), args, num_items_in_batch=Window([inputs], lambda c: c, 1))
    assert str(refused.value) == (
        "unsloth_diffusion_norm: a training micro-batch arrived without its window slot; "
        "was get_batch_samples bypassed?"
    )


@pytest.mark.skipif(MODE != registry.PATCHED, reason="the patched compute_loss of an affected release")
def test_a_weighting_the_release_refuses_is_refused_in_its_own_words(plugin, direct):
    model = direct.model
    ids = torch.tensor([[10, 11, 30, 31]])
    inputs = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}
    args = direct.args(diffusion_time_weighting="linear")
    messages = []
    for context in (contextlib.nullcontext, unsloth_diffusion_norm.unpatched):
        with context(), pytest.raises(ValueError) as refused:
            _nemotron().compute_loss(model, dict(inputs), args)
        messages.append(str(refused.value))
    assert (
        messages[0]
        == messages[1]
        == ("Unsloth: nemotron_labs_diffusion does not support diffusion_time_weighting='linear'.")
    )
    # In a training window the refusal comes before the window's noise is drawn: the RNG is as it was.
    from unsloth_diffusion_norm.batch_keys import SLOT
    from unsloth_diffusion_norm.window import Window

    state = torch.get_rng_state()
    with pytest.raises(ValueError):
        _nemotron().compute_loss(model, {**inputs, SLOT: 0}, args, num_items_in_batch=Window([inputs], int, 1))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("keys", [None, "per-sample"])
def test_the_noise_is_drawn_on_the_batchs_device(plugin, direct, keys):
    """Every noise tensor lives where the batch does (here the meta device: no data, only placement)."""
    from unsloth.models.diffusion_masked import response_mask

    from unsloth_diffusion_norm import noise, per_sample

    model = direct.model
    ids = torch.tensor([[10, 11, 30, 31], [10, 11, 40, 1]], device="meta")
    inputs = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones(2, 4, dtype=torch.long, device="meta")}
    row_keys = None
    if keys:  # (no attention mask: the per-sample draws read the mask on the CPU, and a meta tensor has none)
        del inputs["attention_mask"]
        row_keys = [per_sample.sample_key(0, 0, 0), per_sample.sample_key(0, 0, 1)]
    drawn = noise.draw(_nemotron(), model, inputs, None, response_mask, row_keys)
    assert {t.device.type for t in (drawn.input_ids, drawn.maskable, drawn.masked, drawn.p_mask)} == {"meta"}


@pytest.mark.parametrize("keys", [None, "per-sample"])
def test_a_uniform_draw_equal_to_p_mask_leaves_its_token_unmasked(plugin, direct, keys):
    """A token is masked when its uniform is strictly below p_mask, as the release and the references draw.
    Seed 149504 (found by search: a 2^-24 event per token) makes the 211th uniform equal p_mask exactly."""
    from unsloth.models.diffusion_masked import response_mask

    from unsloth_diffusion_norm import noise
    from unsloth_diffusion_norm.proof import oracle
    from unsloth_diffusion_norm.proof.fixtures import EOS_ID, EPS

    seed, tie, length = 149504, 210, 212
    model = direct.model
    ids = torch.arange(length)[None] % 90 + 5  # (no EOS: every token is an answer token)
    inputs = {"input_ids": ids, "labels": ids}
    # With keys, a row's own generator, seeded with its key, draws t then its tokens' uniforms: the same stream.
    row_keys = [seed] if keys else None
    torch.manual_seed(seed)
    state = torch.get_rng_state()
    drawn = noise.draw(_nemotron(), model, inputs, None, response_mask, row_keys)
    replayed = oracle.replay_noise([{**inputs, "keys": row_keys}], state, EPS, EOS_ID)[0]
    generator = torch.Generator().manual_seed(seed)
    t, u = torch.rand(1, generator=generator), torch.rand(length, generator=generator)
    assert u[tie] == drawn.p_mask[0, tie] == (1 - EPS) * t[0] + EPS  # the tie is there
    assert not drawn.masked[0, tie] and torch.equal(drawn.masked, replayed.masked)
    assert torch.equal(drawn.masked[0], u < drawn.p_mask[0])


def test_per_sample_draws_follow_each_rows_own_tokens_whatever_the_padding_side(plugin, direct):
    """Left padding: a row's own tokens still take its generator's first draws (the oracle replays it so)."""
    from unsloth.models.diffusion_masked import response_mask

    from unsloth_diffusion_norm import noise, per_sample
    from unsloth_diffusion_norm.proof import oracle
    from unsloth_diffusion_norm.proof.fixtures import EOS_ID, EPS

    model = direct.model
    ids = torch.tensor([[1, 1, 10, 30, 31, 32], [10, 11, 40, 41, 42, 43]])
    keys = [per_sample.sample_key(0, 0, 0), per_sample.sample_key(0, 0, 1)]
    inputs = {
        "input_ids": ids,
        "labels": torch.where(ids == 1, -100, ids),
        "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]),
    }
    drawn = noise.draw(_nemotron(), model, inputs, None, response_mask, keys)
    replayed = oracle.replay_noise([{**inputs, "keys": keys}], torch.get_rng_state(), EPS, EOS_ID)[0]
    assert torch.equal(drawn.masked, replayed.masked) and torch.equal(drawn.p_mask, replayed.p_mask)

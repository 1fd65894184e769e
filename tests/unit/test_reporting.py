"""What status() prints and what the plugin warns, word for word, without Unsloth: the Status object, and
the warnings for an unsupported release, each said once."""

import logging

from unsloth_diffusion_norm import activation, registry
from unsloth_diffusion_norm.report import Status


def test_a_fresh_state_is_pending_with_nothing_known():
    state = registry.State()
    assert (state.mode, state.unsloth_version, state.shape, state.reason) == (registry.PENDING, None, None, None)
    assert state.patches == [] and len(state.trainers) == 0


def test_status_prints_every_field_it_has():
    status = Status(
        "patched",
        "2026.10.6",
        "chunked-ce",
        "a reason",
        (("A.b", "why b"), ("C.d", "why d")),
        "the defaults",
        ("C.d",),
        ("x=True", "y='z'"),
    )
    assert str(status).splitlines() == [
        "unsloth_diffusion_norm: mode=patched, Unsloth 2026.10.6",
        "  recognised shape: chunked-ce",
        "  reason: a reason",
        "  defaults: the defaults",
        "  patched A.b: why b",
        "  patched C.d: why d",
        "  DISPLACED C.d: something replaced this patch after it was applied; the fix is not in force there",
        "  a trainer in this process asked for: x=True, y='z'",
    ]
    assert str(Status("pending", None, None, None, ())) == "unsloth_diffusion_norm: mode=pending, Unsloth not imported"


def test_statuses_compare_and_print_by_every_field():
    fields = ("patched", "2026.10.6", "chunked-ce", None, (("A.b", "why"),), "defaults", (), ())
    status = Status(*fields)
    assert status == Status(*fields) and status != fields
    for i, other in enumerate(("native", "2026.10.9", "native-window", "r", (), "d", ("A.b",), ("x=True",))):
        assert status != Status(*fields[:i], other, *fields[i + 1 :]), Status.FIELDS[i]
    assert repr(status) == (
        "Status(mode='patched', unsloth_version='2026.10.6', shape='chunked-ce', reason=None, "
        "patches=(('A.b', 'why'),), defaults='defaults', displaced=(), asked=())"
    )


def test_an_unsupported_release_is_warned_about_once_and_status_keeps_the_latest_reason(state, caplog):
    state.mode = registry.PENDING
    with caplog.at_level(logging.INFO, logger="unsloth_diffusion_norm"):
        activation._unsupported("first reason")
        activation._unsupported("second reason")
    version = state.unsloth_version
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            f"unsloth_diffusion_norm: Unsloth {version} is not supported: first reason. "
            "Nothing was patched; diffusion losses are Unsloth's own.",
        )
    ]
    assert (state.mode, state.reason) == (registry.UNSUPPORTED, "second reason")


def test_doctor_says_whether_the_run_a_config_describes_is_affected_and_why():
    from types import SimpleNamespace

    from unsloth_diffusion_norm.tools import doctor

    def words(mode, native, steps, displaced=()):
        state = SimpleNamespace(mode=mode, displaced=displaced)
        shape = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": steps}
        return doctor.run_words(state, native, shape).removeprefix(
            f" The run in the config (batch 4 x GA {steps} per process)"
        )

    assert words(registry.PATCHED, False, 8) == (
        " is normalized by its window's masked tokens: without the fix its 8 micro-batches per step would each be "
        "divided by their own."
    )
    assert words(registry.PATCHED, False, 1).endswith("it needs the fix only when launched on several processes.")
    for mode in (registry.UNPATCHED, registry.DISABLED, registry.BROKEN):
        assert words(mode, False, 8) == (
            " is affected: each of its 8 micro-batches per step is divided by its own masked tokens."
        )
        assert words(mode, False, 1).startswith(" has one micro-batch per step: on one process it is not affected")
    assert words(registry.PATCHED, False, 8, displaced=("A.b",)).startswith(" is affected")  # the fix is not whole
    for mode in (registry.NATIVE, registry.DISABLED, registry.BROKEN):  # the release's own loss is right
        assert words(mode, True, 8) == " is normalized by its window's masked tokens by the release itself."


def test_the_samples_table_is_markdown_word_for_word():
    """samples.table, what TensorBoard's text tab shows: a row per sample, a pipe in a cell escaped, a line break
    a space, nothing (a missing reference) an empty cell; how each row was decoded."""
    from unsloth_diffusion_norm import samples

    rows = [
        {"index": 0, "prompt": "a|b", "sample": "one\ntwo", "reference": None, "decoding": samples.decoding_of(None)},
        {"index": 7, "prompt": "", "sample": None, "reference": "r", "decoding": samples.decoding_of(32)},
    ]
    assert samples.table(rows) == (
        "| # | prompt | sample | reference | decoding |\n|---|---|---|---|---|\n"
        "| 0 | a\\|b | one two |  | whole canvas |\n| 7 |  |  | r | block by block (32 tokens) |"
    )


def test_a_prompt_of_ones_own_gets_what_fits_after_it_and_a_missing_limit_is_none():
    """samples._room: PROMPT_ANSWER tokens, or fewer where the run's max_length or the model's positions end
    sooner (none where the prompt fills them); arguments or a model config without such a limit limit nothing."""
    from types import SimpleNamespace

    from unsloth_diffusion_norm import samples

    prompt, full = [5] * 10, samples.PROMPT_ANSWER
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=16))
    assert samples._room(model, SimpleNamespace(max_length=12), prompt) == 2
    assert samples._room(model, SimpleNamespace(max_length=None), prompt) == 6
    assert samples._room(model, SimpleNamespace(max_length=8), prompt) == 0
    assert samples._room(SimpleNamespace(), SimpleNamespace(), prompt) == full  # (a model without a config too)
    assert samples._room(SimpleNamespace(config=SimpleNamespace()), SimpleNamespace(max_length=None), prompt) == full

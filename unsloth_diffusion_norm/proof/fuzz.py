"""Random configurations against the oracle: a whole run's settings drawn from the supported space (Hypothesis),
trained through the real DiffusionTrainer on the tiny model (`experiment.train`), every window judged by the oracle
as the hand-picked cases are (`judging.judge`: the logged loss, every gradient, the parameters after the step).

The space: examples (prompt 1-4 tokens; answer 0-14 tokens, with or without its EOS: one-token answers, micro-batches
without a supervised token), batch 1-3 (right padding), GA 1-3 and a partial last window, the seed, global or
per-sample noise, stratified levels, complementary mask pairs, `eps` near 0, in the middle and near 1, 1/p weighting
or none, clipping, `max_length` cutting answers, full fine-tuning or LoRA (the fused and the dense head path),
NVIDIA's profile or LLaDA's opted into the window, a resume from the first window's checkpoint, and a keyed
evaluation after training. `configurations(family)` draws the same space (less LoRA) for another architecture's
tiny copy (Dream's and LLaDA's, own_model), at its family's own objective or opted into the window, judged by that
family's oracle (shifted logits, eps 0, its own normalization). `rank_cases` draws two-rank cases for one launch of
real processes (an empty rank among them). Combinations the plugin refuses by design (stratified levels without
per-sample noise; per-sample noise at LLaDA's own normalization on a release without it; mask pairs where a
family's own loss draws the masks) are not drawn; anything else a run raises is a finding. hypothesis (a test-time
dependency) is imported inside the functions that draw, never at import."""

from dataclasses import asdict, dataclass, replace

from . import experiment, fixtures, judging, oracle
from .fixtures import Example

EPS = (1e-3, 0.02, 0.5, 0.98)  # NVIDIA's floor, near 0, the middle, near 1
PROMPT, ANSWER = range(10, 20), range(20, 90)  # token ids: prompts, answers (clear of EOS, PAD and MASK)


@dataclass(frozen=True)
class Configuration:
    """One drawn run: its examples as (prompt, answer, eos) and its settings."""

    examples: tuple  # ((prompt ids), (answer ids), eos)
    batch_size: int = 1
    gradient_accumulation_steps: int = 2
    seed: int = 0
    per_sample: bool = False
    stratified: bool = False
    complementary: bool = False
    eps: float = 1e-3  # None: the family's own (a copy's run only)
    inverse_t: bool = True
    max_grad_norm: float = 0.0
    max_length: int = None
    lora: str = None  # None, "frozen-head" (the fused-head path) or "saved-head" (dense logits)
    llada: bool = False  # LLaDA's profile on the tiny model, opted into the window
    eval_draws: int = None  # after training, a keyed evaluation of `held` with this many draws; None: none
    held: tuple = ()  # eval examples, as `examples`
    # Another architecture's tiny copy, by its profile ("dream", "llada"; the model itself is check's `model`), and
    # its run's normalization: None, the family's own; "window", opted in.
    family: str = None
    normalization: str = None
    # Two windows or more: saved after the first, resumed from there in a fresh trainer; the resumed run must end
    # bitwise where the uninterrupted one does, and its windows are the ones judged.
    resume: bool = False
    # NVIDIA's block-diffusion mode at this block size (None: not), asked by diffusion_paradigm of a tiny checkpoint
    # shipped bidirectional, at `alpha`.
    block: int = None
    alpha: float = 0.3

    def settings(self, model=None):
        """experiment.train's keywords (`model`: the family copy it trains)."""
        found = dict(
            batch_size=self.batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            seed=self.seed,
            lora=self.lora,
            max_grad_norm=self.max_grad_norm,
        )
        if self.eps is not None:
            found["diffusion_eps"] = self.eps
        if self.normalization is not None:
            found["diffusion_loss_normalization"] = self.normalization
        if self.per_sample:
            found["diffusion_noise"] = "per_sample"
        if self.stratified:
            found["diffusion_t_sampler"] = "stratified"
        if self.complementary:
            found["diffusion_complementary_masks"] = True
        if not self.inverse_t:
            found["diffusion_time_weighting"] = "none"
        if self.max_length is not None:
            found["max_length"] = self.max_length
        if self.block:
            found.update(diffusion_paradigm="block_diff", diffusion_ar_loss_alpha=self.alpha)
            found["checkpoint"] = fixtures.tiny_checkpoint(block_size=self.block)  # (shipped bidirectional)
        if self.eval_draws is not None:
            found.update(
                diffusion_eval_noise="fixed",
                diffusion_eval_draws=self.eval_draws,
                eval_examples=self.rows(self.held, model),
            )
        if model is not None:
            found["checkpoint"] = model.checkpoint
        if self.llada:
            from unsloth.models.diffusion_profiles import diffusion_profiles

            found["diffusion_profile"] = next(p for p in diffusion_profiles() if p.name == "llada")
            found["diffusion_loss_normalization"] = "window"
        return found

    def judged(self, model=None):
        """The oracle's settings; `model`: the family copy the run trained (its ids, its family's objective)."""
        found = judging.OracleSettings(
            eps=self.eps, inverse_t=self.inverse_t, max_grad_norm=self.max_grad_norm, complementary=self.complementary
        )
        if self.block:
            found = replace(found, block=oracle.BlockDiffusion(self.block, self.alpha, self.max_length))
        if model is None:
            return found
        objective = oracle.OBJECTIVES[model.profile]
        return replace(
            found,
            eps=objective.eps if self.eps is None else self.eps,
            eos_id=model.eos_id,
            mask_id=model.mask_id,
            shift=objective.shift,
            normalization=self.normalization or objective.normalization,
        )

    def rows(self, examples=None, model=None):
        """The examples as rows (`model`: a family copy, whose answers close with its own EOS)."""
        if model is None:
            return [Example(list(p), list(a), eos) for p, a, eos in (self.examples if examples is None else examples)]
        return [
            Example(list(p), list(a) + [model.eos_id] * eos, False)
            for p, a, eos in (self.examples if examples is None else examples)
        ]

    def describe(self):
        """One line: the settings that differ from the defaults, and the answers' lengths."""
        plain = Configuration(examples=())
        changed = {k: v for k, v in asdict(self).items() if k not in ("examples", "held") and v != getattr(plain, k)}
        lengths = [len(answer) + eos for _, answer, eos in self.examples]
        return f"{len(self.examples)} examples, supervised lengths {lengths}; " + (
            ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "defaults"
        )


def in_ci(examples):
    """The suite's Hypothesis settings: `examples` per test, derandomized, no example database, and a failure
    reported as found (shrinking one configuration can take minutes of a CI leg; `make fuzz` shrinks)."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )


def _example():
    """An example as (prompt ids, answer ids, eos): an empty answer with its EOS is a one-token answer; without, the
    row has no supervised token."""
    from hypothesis import strategies as st

    return st.tuples(
        st.lists(st.sampled_from(PROMPT), min_size=1, max_size=4).map(tuple),
        st.lists(st.sampled_from(ANSWER), min_size=0, max_size=14).map(tuple),
        st.booleans(),
    )


def _rows(per_window):
    """How many rows: one window or two, the last of them partial or whole."""
    from hypothesis import strategies as st

    return st.integers(1, 2).flatmap(
        lambda windows: st.integers(max(1, per_window * (windows - 1) + 1), per_window * windows)
    )


def configurations(family=None, llada_per_sample=True):
    """The Hypothesis strategy of Configurations: of the tiny model, or of a `family` copy ("dream", "llada";
    `llada_per_sample`: whether the release takes per-sample noise at LLaDA's own normalization, 2026.10.7+)."""
    from hypothesis import strategies as st

    @st.composite
    def draw(draw):
        batch = draw(st.integers(1, 3))
        ga = draw(st.integers(1, 3))
        count = draw(_rows(batch * ga))
        example = _example()
        max_length = draw(st.one_of(st.none(), st.integers(4, 16)))

        # A data set without a supervised token left after truncation is no training run: TRL drops such rows, then
        # Trainer refuses the empty data set (found by the fuzzer; not the plugin's to judge).
        def supervised(rows):
            return any(
                (answer or eos) and (max_length is None or len(prompt) < max_length) for prompt, answer, eos in rows
            )

        examples = tuple(draw(st.lists(example, min_size=count, max_size=count).filter(supervised)))
        kept = sum(supervised([row]) for row in examples)  # (TRL drops the others: they make no window)
        resume = kept > batch * ga and draw(st.booleans())
        # (block diffusion: the tiny model's own mode, without what it does not combine with)
        block = None if family else draw(st.sampled_from((None, None, 2, 3, 5)))
        normalization = draw(st.sampled_from((None, "window"))) if family else None
        per_sample = draw(st.booleans()) and (
            llada_per_sample or family != "llada" or normalization is not None
        )  # (refused by design on 2026.10.4-.6: not drawn there)
        return Configuration(
            examples=examples,
            batch_size=batch,
            gradient_accumulation_steps=ga,
            seed=draw(st.integers(0, 2**16)),
            per_sample=per_sample,
            stratified=per_sample and not block and draw(st.booleans()),  # (keyed levels: per-sample noise only)
            # (a family's own loss draws its masks inside the release: pairs need the window or per-sample noise)
            complementary=not block and draw(st.booleans()) and (not family or normalization is not None or per_sample),
            eps=draw(st.sampled_from(((None,) if family else ()) + EPS)),
            inverse_t=True if block else draw(st.booleans()),
            max_grad_norm=draw(st.sampled_from((0.0, 0.5, 1.0))),
            max_length=max_length,
            lora=None if family else draw(st.sampled_from((None, None, "frozen-head", "saved-head"))),
            llada=not family and not block and draw(st.booleans()),
            eval_draws=None if block else draw(st.sampled_from((None, None, 1, 2, 3))),
            held=tuple(draw(st.lists(example, min_size=1, max_size=3).filter(supervised))),  # (the same: an eval set)
            family=family,
            normalization=normalization,
            resume=resume,
            block=block,
            alpha=draw(st.sampled_from((0.3, 0.5))) if block else 0.3,
        )

    return draw()


def rank_cases():
    """The Hypothesis strategy of two-rank cases (dp_cases.Case, launched by ranks.launch with the suite's own):
    each rank's examples (as `configurations` draws them; or none supervised: an empty rank), GA 1-3 and a partial
    last window, the seed, global or per-sample noise, stratified levels, mask pairs, `eps`, the 1/p weighting or
    none, clipping, full fine-tuning or LoRA, and the count averaged across ranks or rank-local."""
    from hypothesis import strategies as st

    from .dp_cases import Case
    from .fixtures import unsupervised

    @st.composite
    def draw(draw):
        ga = draw(st.integers(1, 3))
        count = draw(_rows(ga))  # (per rank, at batch 1)
        example = _example().map(lambda row: Example(list(row[0]), list(row[1]), row[2]))
        drawn = st.lists(example, min_size=count, max_size=count)
        rank = st.one_of(drawn, drawn, drawn, st.just(unsupervised(count)))  # (an empty rank, one time in four)
        per_sample = draw(st.booleans())
        return Case(
            2,
            [draw(rank), draw(rank)],
            gradient_accumulation_steps=ga,
            average_tokens_across_devices=draw(st.booleans()),
            diffusion_noise="per_sample" if per_sample else None,
            t_sampler="stratified" if per_sample and draw(st.booleans()) else None,
            complementary=draw(st.booleans()),
            lora=draw(st.sampled_from((None, None, "frozen-head", "saved-head"))),
            seed=draw(st.integers(0, 2**16)),
            eps=draw(st.sampled_from(EPS)),
            inverse_t=draw(st.booleans()),
            max_grad_norm=draw(st.sampled_from((0.0, 0.5, 1.0))),
        )

    return draw()


def rank_case_misses(case, rows, native):
    """What a launched two-rank case's results (`rows`, one per rank) miss: ranks outside the oracle's tolerance,
    not under DDP, without their window metrics, or with other collectives than `case.collectives(native)` says.
    [(rank, what)] (empty: it holds)."""
    if len(rows) != case.ranks:
        return [(None, f"results from {len(rows)} ranks")]
    missed = []
    for row in rows:
        if row["model_wrapped"] != "DistributedDataParallel":
            missed.append((row["rank"], f"wrapped in {row['model_wrapped']}"))
        if not row["ok"] or row["metrics_error"] is None:
            missed.append((row["rank"], f"worst error {row['worst']:.3g} tolerances, metrics {row['metrics_error']}"))
        if row["collectives"] != [case.collectives(native)] * len(row["counts"]):
            missed.append((row["rank"], f"collectives {row['collectives']}"))
    return missed


def drawn(strategy, count, seed=None):
    """`count` values of `strategy`, drawn the way the suite draws (derandomized; `seed`: a random round's), for
    checks that run many values at once (the two-rank cases share one launch)."""
    from hypothesis import given, settings
    from hypothesis import seed as seeded

    found = []

    @settings(in_ci(count), derandomize=seed is None)
    @given(strategy)
    def collect(value):
        found.append(value)

    if seed is not None:
        collect = seeded(seed)(collect)
    collect()
    return found


def check(configuration, model=None):
    """Train the configuration and judge every window; then, where it asks for one, its keyed evaluation: the eval
    loss, the spread between draws, the accuracy and the masked CE by noise level, each against the oracle's with
    the keyed masks realized. `model`: the family copy a family configuration trains (own_model.OwnModel: its
    checkpoint, profile, EOS and [MASK] ids). [(what, verdict)] of what misses (empty: it holds)."""
    if (model is None) != (configuration.family is None) or (model and model.profile != configuration.family):
        raise ValueError(f"a {configuration.family or 'tiny model'} configuration, given {model and model.profile}")
    rows, settings = configuration.rows(model=model), configuration.settings(model)
    if configuration.resume:
        runs = experiment.train_and_resume(rows, 1, **settings)
        run, full = runs.resumed, runs.full
        unstepped = run.windows and run.windows[-1].params_after is None
        if unstepped and not experiment.resumed_trainer_steps_a_partial_last_window():
            # A partial last window that the resumed Trainer never steps: transformers 4.x's own (with or without
            # the plugin); the steps it takes are compared and judged.
            run, full = replace(run, windows=run.windows[:-1]), replace(full, windows=full.windows[:-1])
        difference = experiment.final_difference(full, run) if run.windows else 0.0
    else:
        run, difference = experiment.train(rows, **settings), 0.0
    judged = configuration.judged(model)
    missed = [(i, v) for i, v in enumerate(judging.judge(run, window, judged) for window in run.windows) if not v.ok]
    if difference != 0.0:
        missed.append(("resumed run against the uninterrupted one", difference))
    if configuration.eval_draws is None:
        return missed
    metrics = {}
    loss, seen = experiment.evaluate(run.trainer, seed=None, metrics=metrics)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    keyed = judging.keyed_evaluation(
        seen, configuration.seed, draws=configuration.eval_draws, batch_size=configuration.batch_size
    )
    expected = judging.expected_fixed_evaluation_loss(run.reference_model, keyed, judged)
    if abs(loss - expected) > oracle.tolerance(expected):
        missed.append(("eval_loss", (loss, expected)))
    if configuration.eval_draws > 1:
        spread, _ = judging.expected_draw_spread(run.reference_model, keyed, judged)
        # (a spread is a difference of draws' losses: its round-off is theirs, not a share of its own size)
        if abs(metrics["eval_loss_draw_std"] - spread) > max(oracle.tolerance(spread), oracle.tolerance(expected)):
            missed.append(("eval_loss_draw_std", (metrics["eval_loss_draw_std"], spread)))
    scores = judging.expected_evaluation_scores(run.reference_model, keyed, judged)
    if judging.scores_error(metrics, scores) > 1:
        missed.append(("eval scores", (metrics, scores)))
    return missed


# --- bad input -------------------------------------------------------------------------------------------------


def flag_values():
    """(field, value) pairs: every flag with what a user might write there, from Python or YAML (None, booleans,
    numbers with NaN and infinities, texts, lists) or one of its own values."""
    from hypothesis import strategies as st

    from .. import config

    own = [v for flag in config.FIELDS.values() for v in getattr(flag, "choices", ())]
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=12),
        st.sampled_from(own + ["None", "none", "True", "false", "0", "-1", "1e3", " window", "８"]),
        st.lists(st.one_of(st.text(max_size=6), st.integers(), st.none()), max_size=3),
    )
    return st.tuples(st.sampled_from(sorted(config.FIELDS)), values)


def texts():
    """What a command line can carry: any text, or one shaped like a number or an option."""
    from hypothesis import strategies as st

    return st.one_of(
        st.text(max_size=12),
        st.integers(-(2**70), 2**70).map(str),
        st.floats().map(str),
        st.sampled_from(["-1", "--", "-x", "None", "", " ", "１２", "²", "nan", "inf", "1e999", "True"]),
    )


def one_line(said):
    """The lines of stderr that say an error (argparse prints its usage above its one 'PROG: error: ...' line)."""
    return [line for line in said.splitlines() if "error:" in line]


def parse_flag(parser, argv):
    """A command line through a transformers / TRL parser: 'accepted'; or 'refused': exit 2 with one error line
    (a value its flag refuses), or a ValueError of one line naming the package (flags that contradict each other,
    checked when the parser builds DiffusionConfig; examples/train.py prints it as one line and exits 2).
    AssertionError for anything else (another exception escapes)."""
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parser(argv)
    except SystemExit as exited:
        assert exited.code == 2 and len(one_line(said.getvalue())) == 1, (argv, exited.code, said.getvalue())
        return "refused"
    except ValueError as error:
        refused_in_one_line(error)
        return "refused"
    return "accepted"


def refused_in_one_line(error):
    message = str(error)
    assert "\n" not in message and message.startswith("unsloth_diffusion_norm: "), message


def python_flag(parse_dict, settings):
    """Settings given from Python (a dict, as parse_dict and a YAML file's values give them): 'accepted', or
    'refused' (ValueError of one line naming the package); anything else escapes."""
    try:
        parse_dict(settings)
    except ValueError as error:
        refused_in_one_line(error)
        return "refused"
    return "accepted"


def option_values(options):
    """Command lines: a subcommand and up to three of its options (from `options`, (subcommand, option) pairs),
    each followed by a random text or by nothing."""
    from hypothesis import strategies as st

    by_command = {}
    for command, option in options:
        by_command.setdefault(command, []).append(option)

    @st.composite
    def draw(draw):
        command = draw(st.sampled_from(sorted(by_command)))
        argv = [command]
        for option in draw(st.lists(st.sampled_from(by_command[command]), max_size=3)):
            argv += [option] + draw(st.lists(texts(), max_size=1))
        return argv

    return draw()


def parsers():
    """The parsers a user's script builds: transformers' HfArgumentParser, and TRL's TrlParser (YAML configs)."""
    from transformers import HfArgumentParser
    from trl import ModelConfig, ScriptArguments, TrlParser
    from unsloth.models.diffusion_trainer import DiffusionConfig

    return HfArgumentParser(DiffusionConfig), TrlParser((ScriptArguments, DiffusionConfig, ModelConfig))


CPU = ["--bf16", "False", "--use_cpu", "True"]


def check_flag(flag, text, where):
    """One flag's random value from a command line (`text`), from Python and from a YAML file (`flag`'s value):
    each taken, or refused in one line (exit 2, or ValueError naming the package); nothing written under
    `where` (an empty directory) but the YAML file. AssertionError, or the exception that escaped, otherwise."""
    import json
    import math

    hf, trl = parsers()
    field, value = flag
    run = where / "run"
    parse_flag(hf.parse_args_into_dataclasses, ["--output_dir", str(run), f"--{field}", text, *CPU])
    python_flag(hf.parse_dict, {"output_dir": str(run), field: value, "bf16": False, "use_cpu": True})
    exact = not (isinstance(value, float) and not math.isfinite(value))
    written = json.dumps(value) if exact else {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
    path = where / "config.yaml"  # (JSON is YAML: the value written exactly)
    path.write_text(f"dataset_name: local\noutput_dir: {run}\n{field}: {written}\nbf16: false\nuse_cpu: true\n")
    parse_flag(trl.parse_args_and_config, ["--config", str(path)])
    path.unlink()
    assert not list(where.iterdir()), list(where.iterdir())  # nothing written for a run that never started

"""`impact`'s arithmetic against exact values, its command line on a dataset the project builds, and its
one-line refusals (no Unsloth: the arithmetic needs numpy; the command line TRL's tokenization)."""

import dataclasses
import json
import os
from importlib import metadata

import numpy as np
import pytest
import torch

from unsloth_diffusion_norm.tools import cli, impact
from unsloth_diffusion_norm.tools.console import can_plot

# Release-independent (no Unsloth): make test runs it, the matrix legs skip it; the counts a release's trainer
# makes are tests/integration/test_impact_counts.py's, on every leg.
pytestmark = pytest.mark.once

EPS = 1e-3
ANSWER = 10  # maskable tokens of every equal-length answer


def exact_and_estimate(k, world, global_rng, device, rho=impact.rho, draws=100_000):
    """One step of k micro-batches per rank on `world` ranks, batch size 1, equal answers: the exact
    expected share and the Monte Carlo estimate with its 95 % interval, through the real layout, with the
    noise drawn as on `device`."""
    n = k * world
    settings = impact.Settings(
        per_device_train_batch_size=1,
        gradient_accumulation_steps=k,
        world_size=world,
        max_length=None,
        train_sampling_strategy="sequential",
    )
    rows = impact.Prepared(np.full(n, ANSWER + 3), np.full(n, ANSWER), "equal answers")
    plan = impact.layout(rows, settings)
    found = impact.estimate(plan, EPS, draws=draws, seed=1, global_rng=global_rng, rho=rho, device=device)
    return impact.exact_share(k, world, ANSWER, EPS, global_rng), found


# (k, W, global RNG, device); on one rank, or with per-sample noise, the device does not change the draws
CASES = [(2, 1, True, "cuda"), (4, 1, True, "cuda"), (2, 2, False, "cuda"), (2, 2, True, "cpu"), (2, 2, True, "cuda")]


@pytest.mark.parametrize("k, world, global_rng, device", CASES)
def test_the_estimate_holds_the_exact_value_in_its_interval(k, world, global_rng, device):
    exact, found = exact_and_estimate(k, world, global_rng, device)
    assert found.low <= exact <= found.high, (exact, found.share, found.low, found.high)
    assert found.high - found.low < 0.02 * exact  # tight enough that a wrong formula cannot hide in it


def test_the_exact_value_is_the_monte_carlo_limit_of_an_independent_simulation():
    """A plain simulation with no code of impact's: k counts, repeated on every rank (in-sync ranks under the
    global RNG draw identical masks), and k·W independent counts with per-sample noise."""
    rng = np.random.default_rng(7)
    k, world, draws = 2, 2, 400_000
    for global_rng, width in ((True, k), (False, k * world)):
        counts = rng.binomial(ANSWER, (1 - EPS) * rng.random((draws, width)) + EPS)
        counts = np.repeat(counts, k * world // width, axis=1)
        total = counts.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):
            share = np.where(total > 0, 0.5 * np.abs(1 / (k * world) - counts / total).sum(axis=1, keepdims=True), 0)
        half = impact.Z95 * share.std() / np.sqrt(draws)
        assert abs(share.mean() - impact.exact_share(k, world, ANSWER, EPS, global_rng)) <= half, global_rng


# ----------------------------------------------------------------- the global RNG's stream, replayed


def replay(prepared, settings, start, draw):
    """Every rank's noise drawn as the release draws it: start() on every rank (seeding it alike), then per
    micro-batch at position g of the rank's order t, u = draw(g, B, P) (the release: t = rand(B), then
    u = rand(B, P)), masked = (u < (1-eps)·t + eps) & maskable on u's device, where the maskable positions
    are the answer (the end of the row's tokens) and the EOS tail after it. Each row's t and count, rank by
    rank, as the layout orders rows."""
    t_all, counts = [], []
    for rank_batches in impact.micro_batches(len(prepared.length), settings):
        start()
        for g, rows in enumerate(rank_batches):
            length = torch.as_tensor(prepared.length[rows])[:, None]
            answer = torch.as_tensor(prepared.supervised[rows])[:, None]
            at = torch.arange(int(length.max()))[None, :]
            maskable = ((at >= length - answer) & (at < length)) | ((at >= length) & (answer > 0))
            t, u = draw(g, len(rows), at.shape[1])
            masked = (u < ((1 - EPS) * t + EPS)[:, None]) & maskable.to(u.device)
            t_all.append(t.cpu().numpy())
            counts.append(masked.sum(dim=1).cpu().numpy())
    return np.concatenate(t_all), np.concatenate(counts)


def ragged(world, batch):
    """23 rows of unequal lengths, some without an answer: ragged micro-batches with padding."""
    seed = 10 * world + batch
    rng = np.random.default_rng(seed)
    answer = rng.integers(0, 9, 23)
    prepared = impact.Prepared(answer + rng.integers(1, 7, 23), answer, "ragged")
    settings = impact.Settings(
        per_device_train_batch_size=batch, gradient_accumulation_steps=2, world_size=world, max_length=None, seed=seed
    )
    return prepared, settings, seed


@pytest.mark.parametrize("world, batch", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_the_cpu_stream_model_draws_what_torchs_cpu_generator_draws(world, batch, monkeypatch):
    """The CPU model's t and counts from one stream equal a replay of every rank with torch's own CPU
    generator, integer for integer."""
    prepared, settings, seed = ragged(world, batch)
    plan = impact.layout(prepared, settings)
    torch.manual_seed(seed)
    stream = torch.rand(impact.stream_reads(plan, "cpu")[2]).numpy()
    t_real, counts_real = replay(
        prepared, settings, lambda: torch.manual_seed(seed), lambda g, b, p: (torch.rand(b), torch.rand(b, p))
    )
    monkeypatch.setattr(impact.rng_stream, "GATHER", 7)  # the chunked gather reads the same values
    for one in (stream, stream[None]):
        t, counts = impact.stream_counts(plan, one, EPS, device="cpu")
        assert np.array_equal(np.squeeze(t), t_real) and np.array_equal(np.squeeze(counts), counts_real)
    assert counts_real.sum() > 0 and (counts_real == 0).any()


def cuda_calls(prepared, settings):
    """The length of every call's block X_c under CUDA's generator: the largest draw of call c over the
    ranks (call 2g: t of the micro-batch at position g, B values; call 2g+1: its u, B·P values)."""
    batches = impact.micro_batches(len(prepared.length), settings)
    sizes = []
    for g in range(len(batches[0])):
        shapes = [(len(rank[g]), int(prepared.length[rank[g]].max())) for rank in batches]
        sizes += [max(b for b, _ in shapes), max(b * p for b, p in shapes)]
    return sizes


def cuda_draw(blocks):
    """CUDA's indexing, by hand: call c of every rank reads block X_c at the draw's flat indices."""
    return lambda g, b, p: (blocks[2 * g][:b], blocks[2 * g + 1][: b * p].reshape(b, p))


@pytest.mark.parametrize("world, batch", [(2, 1), (2, 2), (3, 2)])
def test_the_cuda_model_reads_every_call_at_the_same_offset_on_every_rank(world, batch, monkeypatch):
    """CUDA's model on the CPU: blocks X_c from a seeded generator, every rank's calls read as torch's CUDA
    kernel indexes them. Rows in the same slot on different ranks get the same t whatever the shapes, u
    values at equal flat indices are the same, and the model's t and counts equal the replay exactly."""
    prepared, settings, _ = ragged(world, batch)
    plan = impact.layout(prepared, settings)
    rng = np.random.default_rng(5)
    blocks = [torch.from_numpy(rng.random(n, dtype=np.float32)) for n in cuda_calls(prepared, settings)]
    t_real, counts_real = replay(prepared, settings, lambda: None, cuda_draw(blocks))
    stream = torch.cat(blocks).numpy()
    assert len(stream) == impact.stream_reads(plan, "cuda")[2]
    monkeypatch.setattr(impact.rng_stream, "GATHER", 7)
    for one in (stream, stream[None]):
        t, counts = impact.stream_counts(plan, one, EPS, device="cuda")
        assert np.array_equal(np.squeeze(t), t_real) and np.array_equal(np.squeeze(counts), counts_real)
    slot = plan.micro_batch // world * batch + plan.position  # (position in the rank's order, row)
    shapes_differ = False
    for s in np.unique(slot):
        here = slot == s
        assert len(set(t_real[here].tolist())) == 1  # one t per slot, on every rank
        shapes_differ |= len(set(plan.padded[plan.micro_batch[here]].tolist())) > 1
    assert shapes_differ  # ranks with unequal shapes at the same position: CPU's stream would part them
    cpu_t, _ = impact.stream_counts(plan, stream, EPS, device="cpu")
    assert not np.array_equal(cpu_t, t_real)
    assert counts_real.sum() > 0 and (counts_real == 0).any()


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: the model of CUDA's generator is checked against the real one there",
)
@pytest.mark.parametrize("world, batch", [(2, 1), (2, 2), (3, 2)])
def test_the_cuda_model_draws_what_cudas_generator_draws(world, batch):
    """Every rank's real draws on the GPU from the same seed (t = rand(B), u = rand(B, P) per micro-batch,
    unequal shapes across ranks) against the CUDA model fed the blocks X_c drawn from the same seed, one call
    of the largest size per call: the value at flat index e of a draw depends only on the seed, the
    generator's offset and e, and every draw moves the offset alike."""
    prepared, settings, seed = ragged(world, batch)
    plan = impact.layout(prepared, settings)

    def real(g, b, p):
        return torch.rand(b, device="cuda"), torch.rand(b, p, device="cuda")

    t_real, counts_real = replay(prepared, settings, lambda: torch.manual_seed(seed), real)
    torch.manual_seed(seed)
    stream = torch.cat([torch.rand(n, device="cuda") for n in cuda_calls(prepared, settings)]).cpu().numpy()
    t, counts = impact.stream_counts(plan, stream, EPS, device="cuda")
    assert np.array_equal(t, t_real) and np.array_equal(counts, counts_real)
    assert counts_real.sum() > 0


def test_in_sync_ranks_share_noise_and_out_of_sync_ranks_do_not_on_cpu_but_do_on_cuda():
    equal = impact.Prepared(np.full(8, 13), np.full(8, ANSWER), "equal")
    settings = impact.Settings(
        per_device_train_batch_size=1, gradient_accumulation_steps=2, world_size=2, max_length=None
    )
    for device in impact.DEVICES:
        t_at, _, _ = impact.stream_reads(impact.layout(equal, settings), device)
        assert np.array_equal(t_at[:4], t_at[4:])  # rank 0's rows, then rank 1's: the same stream indices
        found = impact.estimate(impact.layout(equal, settings), EPS, draws=2000, device=device)
        assert found.distinct_global == 2 and found.distinct_per_sample == 4
    ragged = impact.Prepared(np.arange(8) + 12, np.full(8, ANSWER), "ragged")
    plan = impact.layout(ragged, dataclasses.replace(settings, train_sampling_strategy="sequential"))
    t_at, _, _ = impact.stream_reads(plan, "cpu")
    assert t_at[0] == t_at[4] and len(set(t_at[1:4]) & set(t_at[5:])) == 0  # apart after the first shapes
    found = impact.estimate(plan, EPS, draws=2000, device="cpu")
    assert found.distinct_global == (3 + 4) / 2  # 2 steps of 4 rows: the first micro-batch shared
    t_at, _, _ = impact.stream_reads(plan, "cuda")
    assert np.array_equal(t_at[:4], t_at[4:])  # CUDA: the same slots, whatever the shapes
    found = impact.estimate(plan, EPS, draws=2000, device="cuda")
    assert found.distinct_global == 2 and not found.notes


def test_a_draw_past_cudas_one_offset_step_is_said_in_one_line():
    rows = impact.Prepared(np.array([impact.CUDA_ONE_OFFSET + 1, 20]), np.array([5, 5]), "long")
    settings = impact.Settings(per_device_train_batch_size=1, world_size=2, max_length=None)
    plan = impact.layout(rows, settings)
    assert len(impact.estimate(plan, EPS, draws=2, device="cuda").notes) == 1
    assert not impact.estimate(plan, EPS, draws=2, device="cpu").notes


def rho_inverted(count, total, k, world):
    with np.errstate(divide="ignore", invalid="ignore"):
        return k * world * count / total


def world_ignored(count, total, k, world):
    with np.errstate(divide="ignore", invalid="ignore"):
        return total / (k * count)


@pytest.mark.parametrize(
    "planted, cases",
    [(rho_inverted, CASES), (world_ignored, [c for c in CASES if c[1] > 1])],
    ids=["rho-inverted", "world-ignored"],
)
def test_a_planted_wrong_formula_fails_the_exact_check(planted, cases):
    for k, world, global_rng, device in cases:
        exact, found = exact_and_estimate(k, world, global_rng, device, rho=planted, draws=20_000)
        assert not found.low <= exact <= found.high, (planted.__name__, k, world, device, exact, found.share)


def test_one_micro_batch_per_step_moves_nothing():
    exact, found = exact_and_estimate(1, 1, True, "cuda", draws=2000)
    assert exact == 0 and found.share == 0 and "nothing moved" in found.verdict()
    # ... but where that one micro-batch is the trainer's default, not the user's run, the verdict says so
    # (a run at batch 1 x accumulation 8 once read "nothing moved" from the defaults 8 x 1).
    found.defaulted = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "world_size": 1}
    found.configured = False
    assert found.verdict().endswith(
        "No --config was given: this is a run with the trainer's defaults per_device_train_batch_size=8, "
        "gradient_accumulation_steps=1, world_size=1, not necessarily yours; give your training config (--config) "
        "or these options to measure your run."
    )
    found.configured = True  # a config that leaves them out trains with them: only the launch's size is assumed
    assert found.verdict().endswith("give --world-size N for a run launched on N processes.")
    found.defaulted = {"seed": 42}
    assert found.verdict().endswith("no need to retrain.")


# ------------------------------------------------------------------------------- the command line

TRL = tuple(int(p) for p in metadata.version("trl").split(".")[:2])
needs_trl_1 = pytest.mark.skipif(TRL < impact.TRL_FLOOR, reason="impact follows TRL 1.x's dataset preparation")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The docs' dataset, built here: stdlib docstrings and a BPE tokenizer trained on them."""
    from unsloth_diffusion_norm.tools import docstring_data

    data, tokenizer, _ = docstring_data.write(str(tmp_path_factory.mktemp("demo")))
    return data, tokenizer


@needs_trl_1
def test_impact_on_the_docstring_dataset_prints_the_table_json_and_plot(demo, tmp_path, capsys):
    data, tokenizer = demo
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model_name_or_path: {tokenizer}\ndataset_name: {data}\nper_device_train_batch_size: 2\n"
        "gradient_accumulation_steps: 4\nseed: 3\nlearning_rate: 2.0e-5\ndiffusion_loss_normalization: window\n"
    )
    out_json, out_png = tmp_path / "impact.json", tmp_path / "impact.png"
    argv = ["impact", "--config", str(config), "--world-size", "2"]
    plot = ["--plot", str(out_png)] if can_plot() else []  # matplotlib: the `bench` extra (make test has it)
    code = cli.main([*argv, "--device", "cpu", "--json", str(out_json), *plot])
    out, err = capsys.readouterr()
    assert code == cli.DONE, err
    assert "share of loss weight moved per optimizer step" in out and "verdict:" in out
    assert "distinct noise levels per optimizer step: " in out and "noise drawn on cpu" in out
    report = json.loads(out_json.read_text())
    assert report["settings"]["per_device_train_batch_size"] == 2 and report["settings"]["world_size"] == 2
    assert report["settings"]["device"] == "cpu"
    assert 0 < report["low"] <= report["share"] <= report["high"] < 1
    # 2 x 4 rows a step on each of 2 ranks: on CPU both ranks start the stream at 0 and share their first
    # micro-batch's t; ragged shapes then put them apart.
    assert report["distinct_per_sample"] == 16 and 8 < report["distinct_global"] < 16
    if plot:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # without matplotlib, --plot is one line and exit 2, before any work
        assert cli.main([*argv, "--plot", str(out_png)]) == cli.USAGE
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith("--plot: matplotlib is not installed (pip install 'unsloth-diffusion-norm[bench]' adds it)")
        )
    # --json alone: the report on stdout instead of the table (the default device: CUDA, where every
    # rank's row in the same slot shares its t: 4 positions x 2 rows); 64 rows keep it cheap
    few = tmp_path / "few.jsonl"
    few.write_text("".join(open(data).readlines()[:64]))
    assert cli.main([*argv, "--data", str(few), "--json", "--draws", "300"]) == cli.DONE
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["settings"]["device"] == "cuda" and report["distinct_global"] == 8 and report["draws"] >= 300
    # what the config and the options left out is named: here what a run with this config has by default too
    assert report["defaulted"] == {"diffusion_eps": 0.001, "max_length": 1024} and report["configured"]
    # no config: every setting that cuts the step is the trainer's default, and the verdict says so
    assert cli.main(["impact", "--data", str(few), "--tokenizer", data_tokenizer(config), "--draws", "300"]) == 0
    out, _ = capsys.readouterr()
    assert "not given, so the trainer's defaults: per_device_train_batch_size=8, gradient_accumulation_steps=1, " in out
    assert out.strip().splitlines()[-1].startswith("verdict: one micro-batch per step") and "No --config" in out


def data_tokenizer(config):
    return impact.read_config(config)["model_name_or_path"]


@pytest.fixture(scope="module")
def word_tokenizer():
    from unsloth_diffusion_norm.proof import fixtures

    return os.path.join(fixtures.tiny_checkpoint())


def refusal(capsys, *argv):
    code = cli.main(["impact", *argv])
    out, err = capsys.readouterr()
    assert code == cli.USAGE and out == "", (code, out, err)
    said = [line for line in err.strip().splitlines() if not line.startswith("impact [")]  # progress on a slow day
    assert len(said) == 1 and "Traceback" not in err, err
    return err


@needs_trl_1
def test_bad_input_is_one_line_and_exit_2(word_tokenizer, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "w10 w11", "completion": " w20 w21"}\n')
    good = ["--data", str(rows), "--tokenizer", word_tokenizer]
    assert "no such file" in refusal(capsys, "--data", str(tmp_path / "none.jsonl"), "--tokenizer", word_tokenizer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "has no rows" in refusal(capsys, "--data", str(empty), "--tokenizer", word_tokenizer)
    assert "no usable rows" in refusal(capsys, *good, "--max-length", "2")  # the prompt fills it: TRL drops them
    other = tmp_path / "other.jsonl"
    other.write_text('{"question": "w1", "answer": "w2"}\n')
    assert "columns answer, question" in refusal(capsys, "--data", str(other), "--tokenizer", word_tokenizer)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "w1", "completion": "w2"}\n{"prompt": \n')
    assert "line 2" in refusal(capsys, "--data", str(broken), "--tokenizer", word_tokenizer)
    assert "cannot load a tokenizer" in refusal(capsys, "--data", str(rows), "--tokenizer", str(tmp_path))
    assert "not one" in refusal(capsys, "--data", str(rows), "--tokenizer", str(rows))
    for option in ("--per-device-train-batch-size", "--gradient-accumulation-steps", "--world-size", "--draws"):
        assert "at least 1" in refusal(capsys, *good, option, "0")
    assert "[0, 1)" in refusal(capsys, *good, "--diffusion-eps", "1")
    assert "[0, 1)" in refusal(capsys, *good, "--diffusion-eps", "-0.1")
    assert "cannot write" in refusal(capsys, *good, "--json", str(tmp_path / "no" / "x.json"))
    assert "invalid choice" in refusal(capsys, *good, "--device", "tpu")
    assert "--data" in refusal(capsys, "--tokenizer", word_tokenizer)
    config = tmp_path / "bad.yaml"
    config.write_text("gradient_accumulation_steps: 0\n")
    assert "gradient_accumulation_steps must be" in refusal(capsys, *good, "--config", str(config))
    config.write_text("diffusion_eps: 1.5\n")
    assert "diffusion_eps must be" in refusal(capsys, *good, "--config", str(config))
    assert "cannot read the config" in refusal(capsys, *good, "--config", str(tmp_path / "none.yaml"))

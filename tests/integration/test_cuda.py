"""The cuda tier: the same proof on a GPU - the oracle cases, a full Trainer.train(), Unsloth's compiled chunked
loss, bf16 against its floor, per-sample noise, the lower-variance noise, doctor's self-check - through the same
cases and judges as on the CPU, given device="cuda". Marked `cuda`; skipped, saying why, where
torch.cuda.is_available() is false, so on a CPU host it costs collection only. scripts/gpu_check.sh runs it on a
GPU machine (docs/gpu.md)."""

import sys

import pytest
import torch
from test_field import BF16, bf16_tolerance_is_justified_by_the_ga1_floor
from test_lower_variance import CASES as LOWER_VARIANCE
from test_lower_variance import lower_variance_matches_oracle
from test_oracle_cases import (
    CASES,
    full_training_windows_2_2_1_with_evaluation_parity,
    per_sample_noise_matches_oracle,
    plugin_matches_oracle_and_unpatched_misses,
)

import unsloth_diffusion_norm
from unsloth_diffusion_norm.proof import experiment, fixtures, judging, oracle, scenarios
from unsloth_diffusion_norm.tools import doctor

CUDA = "cuda"
on_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the cuda tier needs a CUDA device and torch.cuda.is_available() is False here "
    "(scripts/gpu_check.sh runs it on a GPU machine; docs/gpu.md)",
)


@pytest.fixture(scope="module")
def fp32():
    """fp32 on the GPU is fp32: no TF32 in matrix products (the oracle's fp32 tolerance is fp32 round-off)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def compiled_against_eager(device, case):
    """Unsloth's chunked cross-entropy with its compile path on ("auto": compiled chunks on CUDA) and off, each
    window judged by the oracle, and the two runs' gradients within the oracle's tolerance of each other."""
    from unsloth.models import diffusion_loss

    runs = {}
    for mode in ("auto", False):
        unsloth_diffusion_norm.apply()
        run = experiment.train(**CASES[case], device=device, diffusion_compile=mode)
        compiled = diffusion_loss.compile_loss(run.trainer.args, device)
        assert compiled == (mode == "auto" and torch.device(device).type == "cuda"), (mode, compiled)
        assert all(judging.judge(run, w).ok for w in run.windows), (case, mode)
        runs[mode] = run
    for a, b in zip(runs["auto"].windows, runs[False].windows):
        assert a.logged_loss == pytest.approx(b.logged_loss, abs=oracle.tolerance(b.logged_loss))
        for name, grad in b.grads.items():
            assert oracle.max_error(a.grads[name], grad) <= oracle.tolerance(grad), name


@pytest.mark.cuda
@on_cuda
@pytest.mark.parametrize("case", list(CASES))
def test_oracle_cases_on_cuda_in_fp32(case, fp32, record_property):
    verdicts = plugin_matches_oracle_and_unpatched_misses(case, device=CUDA)
    # Into the JUnit XML: the per-case figures docs/gpu.md reports.
    record_property("worst_error_over_tolerance", max(v.worst for v in verdicts))
    record_property("grad_error", max(v.grad_error for v in verdicts))
    record_property("counts", [v.counts for v in verdicts])


@pytest.mark.cuda
@on_cuda
def test_the_tiny_model_loads_in_fp32_on_the_gpu(fp32):
    model, _ = fixtures.load_model(lora="frozen-head", device=CUDA)
    assert {(p.dtype, p.device.type) for p in model.parameters()} == {(torch.float32, CUDA)}


@pytest.mark.cuda
@on_cuda
def test_full_training_windows_2_2_1_with_evaluation_parity_on_cuda(fp32):
    unsloth_diffusion_norm.apply()
    full_training_windows_2_2_1_with_evaluation_parity(device=CUDA)


@pytest.mark.cuda
@on_cuda
@pytest.mark.parametrize("case", ["seed-0", "lora-saved-head-dense-path"])  # fused head; dense logits
def test_compiled_chunked_loss_against_eager_and_the_oracle_on_cuda(case, fp32):
    pytest.importorskip("unsloth.models.diffusion_loss", reason="the dense shape (2026.10.4-.5) has no chunked loss")
    compiled_against_eager(CUDA, case)


@pytest.mark.cuda
@on_cuda
def test_bf16_on_cuda_against_the_bf16_floor_measured_there(fp32):  # autocast aside, the oracle's fp32 is fp32
    outcomes = {name: scenarios.examine(name, scenarios.SCENARIOS[name], device=CUDA) for name in BF16}
    print("\n" + scenarios.render(outcomes.values()))
    bf16_tolerance_is_justified_by_the_ga1_floor(outcomes)


@pytest.mark.cuda
@on_cuda
@pytest.mark.parametrize("case", ["seed-0", "batch-2-right-padding", "lora-frozen-head-fused-path"])
def test_per_sample_noise_on_cuda_equals_the_oracles_cpu_replay(case, fp32):
    unsloth_diffusion_norm.apply()
    per_sample_noise_matches_oracle(case, device=CUDA)


@pytest.mark.cuda
@on_cuda
@pytest.mark.parametrize("case", list(LOWER_VARIANCE))
def test_lower_variance_noise_on_cuda_matches_the_oracle(case, fp32):
    unsloth_diffusion_norm.apply()
    lower_variance_matches_oracle(case, device=CUDA)


@pytest.mark.cuda
@on_cuda
def test_doctor_self_check_on_cuda(fp32, record_property):
    unsloth_diffusion_norm.apply()
    report = doctor.examine(device=CUDA)
    check = report["self_check"]
    record_property("self_check", check)
    assert report["exit"] == doctor.FIXED and check["passed"] and check["device"] == CUDA, report
    assert len(set(check["counts"])) > 1  # a window the bug would show in
    assert report["device"].startswith("cuda")


@pytest.mark.cuda
@on_cuda
def test_convergence_gpu_preset_in_its_quick_form(tmp_path):
    """scripts/convergence.py --gpu's code at the tiny size: paired seeds trained in bf16 on the GPU, held-out draws
    the trainer's own fixed evaluation noise (bf16 training, fp32 measurement: the two read the same weights)."""
    from unsloth_diffusion_norm.tools.convergence import WINDOW, part2, seeds

    found, size, _ = part2(seeds.GPU_QUICK, str(tmp_path))
    for arm in found[WINDOW]:
        assert [s for s, _ in arm.measured] == list(range(seeds.GPU_QUICK.steps + 1))
        assert abs(arm.held_out - arm.measured[-1][1]["eval_loss"]) <= oracle.BF16_RTOL * abs(arm.held_out)
    assert "| objective |" in seeds.render(seeds.report(found, size, seeds.GPU_QUICK))


@pytest.mark.cuda
@on_cuda
def test_block_diffusion_on_cuda_runs_the_models_flex_attention_which_the_cpus_stand_in_equals(fp32, tmp_path):
    """On a GPU FlexAttention has a backward: the CPU's stand-in gives its output and its gradients, and a
    block_diff checkpoint trains through the model's own FlexAttention to the oracle's objective."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from unsloth_diffusion_norm import block_attention
    from unsloth_diffusion_norm.proof.fixtures import mixed_answers
    from unsloth_diffusion_norm.proof.tiny_model import modeling_nemotron_labs_diffusion as tiny
    from unsloth_diffusion_norm.proof.tiny_model import write_tiny_checkpoint

    generator = torch.Generator(CUDA).manual_seed(0)
    q, k, v = (torch.randn(2, 3, 24, 8, device=CUDA, generator=generator, requires_grad=True) for _ in range(3))
    rule = lambda b, h, query, key: tiny.block_diff_rule(4, query, key, 12)  # noqa: E731
    block_mask = create_block_mask(rule, B=None, H=None, Q_LEN=24, KV_LEN=24, device=CUDA)
    outputs = [
        flex_attention(q, k, v, block_mask=block_mask),
        block_attention.dense_flex_attention(q, k, v, block_mask),
    ]
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v)) for out in outputs]
    assert oracle.max_error(outputs[1], outputs[0]) <= oracle.tolerance(outputs[0])
    for flex, dense in zip(*grads):
        assert oracle.max_error(dense, flex) <= oracle.tolerance(flex)
    unsloth_diffusion_norm.apply()
    block = write_tiny_checkpoint(str(tmp_path / "tiny"), dlm_paradigm="block_diff", block_size=4)
    run = experiment.train(mixed_answers(4), checkpoint=block, device=CUDA)
    module = next(m for m in run.trainer.model.modules() if type(m).__name__ == block_attention.FLEX_CLASS)
    assert getattr(sys.modules[type(module).__module__], block_attention.FLEX_FUNCTION) is not (
        block_attention.dense_flex_attention
    )  # the model's own FlexAttention trained
    settings = judging.OracleSettings(block=oracle.BlockDiffusion(4))
    assert all(judging.judge(run, window, settings).ok for window in run.windows)


# --- what of the tier a CPU can run: its own code at device="cpu", so that a slip shows before a GPU run (the
# helpers it shares with test_oracle_cases.py and test_field.py run in those files' CPU tests) -------------------


@pytest.mark.once  # the same code on every release; the oracle cases' CPU tests run the tier's judge
def test_the_tiers_compile_check_runs_on_cpu_where_auto_is_eager():
    pytest.importorskip("unsloth.models.diffusion_loss", reason="the dense shape (2026.10.4-.5) has no chunked loss")
    compiled_against_eager("cpu", "seed-0")


def test_noise_drawn_on_a_device_replays_from_that_devices_generator():
    """The oracle replays global-RNG noise from the state of the generator that drew it: the CPU generator's
    (a tensor) or an accelerator's (DeviceRng); both forms name the same CPU draws here."""
    batch = {"input_ids": torch.arange(3, 15).reshape(2, 6), "labels": torch.arange(3, 15).reshape(2, 6)}
    torch.manual_seed(7)
    plain = oracle.replay_noise([batch, batch], oracle.rng_state("cpu"), 1e-3, 0)
    named = oracle.replay_noise([batch, batch], oracle.DeviceRng("cpu", torch.get_rng_state()), 1e-3, 0)
    for a, b in zip(plain, named):
        assert torch.equal(a.masked, b.masked) and torch.equal(a.p_mask, b.p_mask)
    assert not torch.equal(plain[0].masked, plain[1].masked)  # one stream across the micro-batches

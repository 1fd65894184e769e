"""How a window's count is combined across processes, and the loss factor, for every layout."""

import pytest
from accelerate import ParallelismConfig

from unsloth_diffusion_norm.window import counting_rule


# Layouts where several processes hold the same batch cannot run on CPU here; the arithmetic that
# decides them is the same as transformers' Trainer uses for token-counted losses.
@pytest.mark.parametrize(
    "average, processes, layout, expected",
    [
        (True, 1, None, (None, 1)),  # one process: its own count
        (False, 4, None, (None, 1)),  # rank-local, as asked
        (True, 2, None, (1, 2)),  # two ranks: the smallest data parallel
        (True, 4, None, (1, 4)),  # plain DDP: sum over ranks, undo the gradient average
        (True, 4, dict(dp_shard_size=2, tp_size=2), (2, 2)),  # TP pairs hold one batch: count it once
        (True, 4, dict(dp_shard_size=2, cp_size=2), (2, 4)),  # CP ranks share a batch, gradients average over them
        (True, 8, dict(dp_replicate_size=2, dp_shard_size=2, tp_size=2), (2, 4)),
    ],
)
def test_counting_rule_for_parallel_layouts(average, processes, layout, expected):
    config = None if layout is None else ParallelismConfig(**layout)
    assert counting_rule(average, processes, processes, config) == expected


@pytest.mark.parametrize(
    "layout", [dict(dp_shard_size=2, tp_size=2), dict(dp_replicate_size=2, dp_shard_size=2, tp_size=2)]
)
def test_native_opt_in_keeps_upstreams_count_so_tensor_parallel_is_not_counted_twice(layout):
    """On 2026.10.7+ diffusion_noise='global' keeps upstream's compute_loss, which multiplies the loss by
    every process; its count must then be upstream's too (every process summed). Both the plugin's own
    rule and upstream's give each rank the gradient of sum(S) / sum(N) when TP pairs hold one batch."""
    config = ParallelismConfig(**layout)
    processes = config.total_size
    assert counting_rule(True, processes, processes, config, upstream=True) == (1, processes)
    shards = [7, 11, 3, 5][: processes // config.tp_size]
    gathered = [count for count in shards for _ in range(config.tp_size)]  # a TP pair counts one batch twice
    compositions = []
    for upstream in (False, True):
        replicas, scale = counting_rule(True, processes, processes, config, upstream)
        compositions.append(scale / (sum(gathered) // replicas))  # loss factor / the window's count
    dp = processes // config.tp_size  # gradients average over the data-parallel ranks
    assert compositions[0] == compositions[1] == dp / sum(shards)


class Trainer:
    """(A plain object: the plugin keeps per-trainer records in the trainer's own __dict__.)"""


def trainer_on(processes, layout=None, average=True):
    """A trainer as data_parallel_rule sees it: its arguments and its accelerator, whose gather hands back
    every process's count (this one's as given, the others' made up as it + 1, it + 2, ...)."""
    from types import SimpleNamespace

    import torch

    def gather(count):
        return torch.cat([count + r for r in range(processes)])

    args = SimpleNamespace(average_tokens_across_devices=average, world_size=processes)
    accelerator = SimpleNamespace(
        num_processes=processes,
        gather=gather,
        parallelism_config=None if layout is None else ParallelismConfig(**layout),
    )
    trainer = Trainer()
    trainer.args, trainer.accelerator = args, accelerator
    return trainer


def test_the_rule_bound_to_a_trainer_gathers_once_and_counts_each_batch_once():
    import torch

    from unsloth_diffusion_norm.window import data_parallel_rule

    reduce, scale = data_parallel_rule(trainer_on(4, dict(dp_shard_size=2, tp_size=2)))
    assert scale == 2 and reduce(torch.tensor(10)) == (10 + 11 + 12 + 13) // 2
    reduce, scale = data_parallel_rule(trainer_on(4, dict(dp_shard_size=2, tp_size=2)), upstream=True)
    assert scale == 4 and reduce(torch.tensor(10)) == 10 + 11 + 12 + 13
    reduce, scale = data_parallel_rule(trainer_on(2, average=False))  # rank-local, as asked: no collective
    assert scale == 1 and reduce(torch.tensor(10)) == 10
    big = data_parallel_rule(trainer_on(2))[0](torch.tensor(2**24 + 1))  # a count past float32's whole numbers
    assert big == 2**25 + 3 and big.dtype == torch.int64
    # A block-diffusion window's two counts (masked, supervised) in the same one gather, each summed on its own
    both = data_parallel_rule(trainer_on(4, dict(dp_shard_size=2, tp_size=2)))[0](torch.tensor([10, 20]))
    assert both.tolist() == [(10 + 11 + 12 + 13) // 2, (20 + 21 + 22 + 23) // 2]


def test_a_window_that_runs_out_of_data_keeps_what_it_got_in_order():
    from types import SimpleNamespace

    from unsloth_diffusion_norm.batch_keys import SLOT
    from unsloth_diffusion_norm.window import fetch

    trainer = SimpleNamespace(_prepare_inputs=lambda inputs: {**inputs, "prepared": True})
    batches = fetch(trainer, iter([{"x": 1}, {"x": 2}]), 3)  # a stream's last, partial window
    assert batches == [{"x": 1, "prepared": True, SLOT: 0}, {"x": 2, "prepared": True, SLOT: 1}]
    assert fetch(trainer, iter([]), 2) == []


def test_a_collected_window_carries_its_rule_and_spent_data_gives_what_trainers_own_fetch_gives():
    """collect: the micro-batches and their Window (its count's reduction and loss scale); ([], None) once the data
    is spent, as Trainer's own get_batch_samples returns then."""
    from types import SimpleNamespace

    from unsloth_diffusion_norm.window import Window, collect

    trainer = SimpleNamespace(_prepare_inputs=lambda inputs: inputs)
    rule = (lambda count: count * 2, 3)
    batches, window = collect(trainer, iter([{"x": 1}, {"x": 2}]), 2, rule)
    assert len(batches) == 2 and isinstance(window, Window) and window.batches is batches
    assert (window.reduce_count, window.loss_scale) == rule
    assert collect(trainer, iter([]), 2, rule) == ([], None)


def test_an_accelerator_without_parallelism_config_is_plain_data_parallel():
    import torch

    from unsloth_diffusion_norm.window import data_parallel_rule

    trainer = trainer_on(2)
    del trainer.accelerator.parallelism_config  # accelerate before ParallelismConfig existed
    reduce, scale = data_parallel_rule(trainer)
    assert scale == 2 and reduce(torch.tensor(3)) == 3 + 4


def test_a_window_divides_by_its_count_and_scales_the_loss_alone():
    """Window.divide hands the window's count to the loss as its denominator, then multiplies the loss (not the
    outputs or the metrics) by the data-parallel factor; at factor 1 the loss's own result comes back untouched."""
    import torch

    from unsloth_diffusion_norm.window import Window

    def loss_of(denominator):
        return torch.tensor(6.0) / denominator, "outputs", {"masked_ce": 1.5}

    window = Window([{}], lambda count: count, 1)
    window.count = torch.tensor(3.0)
    result = window.divide(loss_of)
    assert result[0].item() == 2.0 and result[1:] == ("outputs", {"masked_ce": 1.5})
    scaled = Window([{}], lambda count: count, 4)
    scaled.count = torch.tensor(3.0)
    assert scaled.divide(loss_of)[0].item() == 8.0 and scaled.divide(loss_of)[1:] == ("outputs", {"masked_ce": 1.5})
    same = (torch.tensor(1.0), None, {})
    assert window.divide(lambda count: same) is same


def test_a_ranks_window_summary_is_exact_and_on_the_counts_device():
    """metrics.summary, what a rank hands the others: every count exact past float32's 2**24 (a slot with none:
    ABSENT), the rows' levels read from a one-token batch, and every tensor on the counts' device, also under
    another default device (a GPU run's data beside a CPU default: here the meta device)."""
    from types import SimpleNamespace

    import torch

    from unsloth_diffusion_norm import metrics

    many = 2**24 + 1  # float32 rounds it to 2**24
    noises = [SimpleNamespace(p_mask=torch.full((many - 1, 1), 0.25)), SimpleNamespace(p_mask=torch.full((1, 1), 0.25))]
    counts = torch.tensor([many, 3])
    with torch.device("meta"):
        found = metrics.summary(noises, counts, 3)
    expected = [many, 3, metrics.ABSENT, 0.25 * many, 0.0625 * many, many]
    assert found.dtype == torch.float64 and found.device == counts.device and found.tolist() == expected


def test_every_metrics_path_counts_each_batch_once_where_tensor_parallel_ranks_hold_the_same_one():
    """metrics.observer and a run's per-trainer metric records (metrics._kept) take the plugin's counting rule: TP
    pairs hold one batch, so the processes' counts are summed over 2 replicas; upstream's rule (2026.10.7+, whose
    own loss multiplies by every process) sums them all, and so do the windows a native release's fetch draws
    (metrics.log_drawn) or the plugin fetches undrawn for it."""
    from types import SimpleNamespace

    import torch

    from unsloth_diffusion_norm import metrics

    trainer = trainer_on(4, dict(dp_shard_size=2, tp_size=2))
    rows = [SimpleNamespace(p_mask=torch.tensor([[0.5]]))]
    everyone = trainer.accelerator.gather(metrics.summary(rows, torch.tensor([10]), 1)[None])  # every rank's
    for upstream, replicas in ((False, 2), (True, 1)):
        count, found, supervised = metrics.observer(trainer, upstream)(1)(rows, torch.tensor([10]))
        assert count == (10 + 11 + 12 + 13) // replicas and count.dtype == torch.int64, upstream
        assert supervised is None  # (a bidirectional window has no second count)
        assert {k: v.item() for k, v in found.items()} == {
            k: v.item() for k, v in metrics.of(everyone, 1, count).items()
        }
    assert metrics.observer(trainer)(1)(rows, torch.tensor([10]))[0] == (10 + 11 + 12 + 13) // 2  # (the default)
    # A block-diffusion window's supervised tokens ride in the same gather, counted as the masked ones are; its
    # metrics are those of the summary without them
    count, found, supervised = metrics.observer(trainer)(1)(rows, torch.tensor([10]), torch.tensor(30))
    assert count == (10 + 11 + 12 + 13) // 2 and supervised == (30 + 31 + 32 + 33) // 2
    assert supervised.dtype == torch.int64
    assert {k: v.item() for k, v in found.items()} == {k: v.item() for k, v in metrics.of(everyone, 1, count).items()}
    # A window a natively fixed release drew at its fetch is counted as upstream counts (every process's summed)
    from collections import defaultdict

    from unsloth_diffusion_norm.batch_keys import UNSLOTH_PREPARED
    from unsloth_diffusion_norm.noise import Noise

    trainer._diffusion_metrics = defaultdict(list)
    drawn = Noise(None, None, None, torch.ones(1, 10, dtype=torch.bool), torch.tensor([[0.5]]))
    metrics.log_drawn(trainer, [{UNSLOTH_PREPARED: drawn.prepared()}], 1)
    assert trainer._diffusion_metrics[f"train/{metrics.COUNT}"] == [torch.tensor(10.0 + 11 + 12 + 13)]
    metrics.log_drawn(trainer, [], 1)  # a spent fetch (streamed data runs out): nothing to say
    trainer.args.diffusion_metrics = False
    metrics.log_drawn(trainer, [{UNSLOTH_PREPARED: drawn.prepared()}], 1)  # metrics off: nothing
    assert len(trainer._diffusion_metrics[f"train/{metrics.COUNT}"]) == 1
    trainer.args.diffusion_metrics = True
    # and so is a window the plugin fetches undrawn for upstream's loss (diffusion_noise="global" there)
    from unsloth_diffusion_norm import native

    trainer._prepare_inputs = lambda inputs: inputs
    _, undrawn = native._fetch_undrawn(lambda count: count, None, None, None, trainer, (iter([{}]), 1), {})
    undrawn.noise(0, lambda batch: drawn)
    assert undrawn.count == 10 + 11 + 12 + 13
    trainer.args.gradient_accumulation_steps = 3
    steps = metrics.own_steps(trainer)  # (kept on the trainer: made once, with its accelerator and count rule)
    assert (steps.accelerator, steps.replicas, steps.slots) == (trainer.accelerator, 2, 3)
    assert metrics.own_steps(trainer) is steps


def test_the_training_accuracy_is_each_windows_hits_over_its_count_summed_over_replicas():
    """metrics.TrainingAccuracy across TP pairs (2 replicas): every process's shares summed over the replicas,
    over the most windows any rank saw mask a token (a window of one masked token counts); one gather per log,
    none where no window was collected since the last."""
    import torch

    from unsloth_diffusion_norm import metrics

    trainer = trainer_on(4, dict(dp_shard_size=2, tp_size=2))
    gathered = []
    gather = trainer.accelerator.gather
    trainer.accelerator.gather = lambda t: gathered.append(t) or gather(t)
    accuracy = metrics.TrainingAccuracy(trainer.accelerator, 2)
    assert accuracy.take("cpu") is None and gathered == []
    logits = torch.eye(4)[None]  # position i: token i's logit the highest
    for tokens, masked in (([0, 0, 0, 0], [1, 0, 0, 0]), ([0, 1, 2, 0], [1, 1, 1, 1])):  # 1 of 1, 3 of 4 hit
        masked = torch.tensor([masked], dtype=torch.bool)
        accuracy.collected()
        accuracy.counted(masked.sum())
        accuracy.scored(logits, torch.tensor([tokens]), masked, masked.sum())
    found = accuracy.take("cpu")
    # This rank: share 1/1 + 3/4, two windows; the others' made up as share + r, windows + r (r = 1, 2, 3).
    assert found == (4 * 1.75 + 6) / 2 / (2 + 3) and len(gathered) == 1
    assert accuracy.take("cpu") is None and len(gathered) == 1  # (started afresh: nothing since the last log)

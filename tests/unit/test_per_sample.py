"""Per-sample noise keys: one generator seed per example from (seed, epoch, global position), and where
each micro-batch of each rank sits in the global order - map-style and streaming data, fresh or resumed."""

from types import SimpleNamespace

import torch

from unsloth_diffusion_norm.batch_keys import ROWS
from unsloth_diffusion_norm.per_sample import DataOrder, sample_key, stratified, uniforms, window_strata


def test_sample_keys_are_deterministic_distinct_and_depend_on_every_part():
    key = sample_key(0, 0, 5)
    assert key == sample_key(0, 0, 5) and 0 <= key < 2**63
    others = {sample_key(1, 0, 5), sample_key(0, 1, 5), sample_key(0, 0, 6)}
    assert key not in others and len(others) == 3  # seed, epoch and position each change the key
    assert len({sample_key(0, epoch, position) for epoch in range(4) for position in range(64)}) == 256


def test_an_examples_own_draws_do_not_depend_on_its_padding():
    keys = [sample_key(0, 0, 0), sample_key(0, 0, 1)]
    t_short, u_short = uniforms(keys, torch.tensor([[1, 1, 1], [1, 1, 0]]), 3, "cpu")
    t_long, u_long = uniforms(keys, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]), 5, "cpu")
    assert torch.equal(t_short, t_long)
    assert torch.equal(u_short[0], u_long[0, :3]) and torch.equal(u_short[1, :2], u_long[1, :2])


def arguments(**overrides):
    settings = dict(
        seed=0,
        world_size=1,
        process_index=0,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        ignore_data_skip=False,
    )
    return SimpleNamespace(**{**settings, **overrides})


def batch(rows):
    return {"input_ids": torch.zeros(rows, 3, dtype=torch.long)}


def positions(order, args, batches):
    """The global positions the tagged micro-batches were given (recovered from their keys)."""
    lookup = {sample_key(args.seed, order.epoch, p): p for p in range(1000)}
    return [[lookup[k] for k in tagged[ROWS].keys] for tagged in order.tag(args, batches)]


def test_positions_follow_accelerates_round_robin_over_ranks():
    # Rank r's m-th micro-batch is global batch m*W + r; its row j sits at (m*W + r)*B + j.
    for rank in (0, 1, 2):
        args = arguments(world_size=3, process_index=rank)
        order = DataOrder()
        order.on_epoch_begin(args, SimpleNamespace(global_step=0), None, train_dataloader=[0] * 4)
        assert positions(order, args, [batch(2), batch(2)]) == [[2 * rank, 2 * rank + 1], [6 + 2 * rank, 7 + 2 * rank]]


def test_epoch_and_skipped_batches_come_from_the_global_step_on_map_style_data():
    args = arguments()
    order = DataOrder()
    order.on_train_begin(args, None, None)
    order.on_epoch_begin(args, SimpleNamespace(global_step=3), None, train_dataloader=[0] * 4)  # 2 steps/epoch
    assert (order.epoch, order.next_batch) == (1, 2)  # epoch 1, one window (2 micro-batches) done


def test_streaming_data_counts_epochs_as_they_begin_and_skips_on_resume():
    args = arguments()
    stream = iter(())  # no len(): Trainer runs epoch after epoch until max_steps
    order = DataOrder()
    order.on_train_begin(args, None, None)
    order.on_epoch_begin(args, SimpleNamespace(global_step=0), None, train_dataloader=stream)
    assert (order.epoch, order.next_batch) == (0, 0)
    order.next_batch = 5
    order.on_epoch_begin(args, SimpleNamespace(global_step=3), None, train_dataloader=stream)
    assert (order.epoch, order.next_batch) == (1, 0)
    resumed = DataOrder()  # a resumed run skips global_step windows of its first epoch, as Trainer does
    resumed.on_train_begin(args, None, None)
    resumed.on_epoch_begin(args, SimpleNamespace(global_step=3), None, train_dataloader=stream)
    assert (resumed.epoch, resumed.next_batch) == (0, 6)


def test_the_same_example_gets_other_noise_in_another_epoch():
    args = arguments()
    order = DataOrder()
    order.on_train_begin(args, None, None)
    keys = []
    for epoch in range(2):
        order.on_epoch_begin(args, SimpleNamespace(global_step=2 * epoch), None, train_dataloader=[0] * 4)
        keys.append(next(order.tag(args, [batch(2)]))[ROWS].keys)
    assert set(keys[0]).isdisjoint(keys[1])


def test_without_an_attention_mask_every_token_is_the_examples_own():
    keys = [sample_key(0, 0, 0), sample_key(0, 0, 1)]
    t, u = uniforms(keys, None, 4, "cpu")
    t_full, u_full = uniforms(keys, torch.ones(2, 4, dtype=torch.long), 4, "cpu")
    assert u.shape == (2, 4) and torch.equal(t, t_full) and torch.equal(u, u_full)


def test_an_epoch_of_one_window_or_less_is_one_step():
    order = DataOrder()
    for batches in (2, 1):  # GA 2: one full window, and one partial window
        order.on_epoch_begin(arguments(), SimpleNamespace(global_step=3), None, train_dataloader=[0] * batches)
        assert (order.epoch, order.next_batch) == (3, 0)


def test_left_padding_does_not_move_an_examples_own_draws():
    keys = [sample_key(0, 0, 0)]
    _, u_alone = uniforms(keys, torch.tensor([[1, 1, 1]]), 3, "cpu")
    _, u_left = uniforms(keys, torch.tensor([[0, 0, 1, 1, 1]]), 5, "cpu")
    assert torch.equal(u_alone[0], u_left[0, 2:])


def test_the_draws_go_to_the_batchs_device():
    t, u = uniforms([sample_key(0, 0, 0)], None, 3, torch.device("meta"))
    assert t.device.type == u.device.type == "meta"


def test_sample_keys_follow_the_documented_recipe():
    """blake2b (8 bytes) of "seed:epoch:position", little-endian, top bit dropped: the seeds stay the same
    across plugin versions, so a run resumed after an upgrade draws what it would have drawn."""
    import hashlib

    for seed, epoch, position in ((0, 0, 0), (42, 3, 12345), (2**31, 7, 1)):
        digest = hashlib.blake2b(f"{seed}:{epoch}:{position}".encode(), digest_size=8).digest()
        assert sample_key(seed, epoch, position) == int.from_bytes(digest, "little") // 2


def test_a_resumed_stream_with_ignore_data_skip_starts_its_first_epoch_at_the_beginning():
    args = arguments(ignore_data_skip=True)  # Trainer then does not skip the data already seen
    order = DataOrder()
    order.on_train_begin(args, None, None)
    order.on_epoch_begin(args, SimpleNamespace(global_step=3), None, train_dataloader=iter(()))
    assert (order.epoch, order.next_batch) == (0, 0)


def test_a_steps_strata_are_a_permutation_keyed_by_seed_epoch_and_window():
    strata = window_strata(0, 0, 0, 8)
    assert sorted(strata) == list(range(8)) and strata == window_strata(0, 0, 0, 8)
    others = [window_strata(1, 0, 0, 8), window_strata(0, 1, 0, 8), window_strata(0, 0, 1, 8)]
    assert all(other != strata for other in others)  # (each equal by chance with probability 1/8!)


def test_a_rows_level_moves_into_its_stratum_in_the_draws_dtype():
    t = torch.tensor([0.0, 0.5, 0.999], dtype=torch.float64)
    moved = stratified(t, [(0, 4), (3, 4), (1, 2)])
    assert moved.dtype == torch.float64 and moved.tolist() == [0.0, 3.5 / 4, 1.999 / 2]


def test_stratified_rows_take_their_strata_from_their_steps_keyed_permutation():
    """n = batch 3 × GA 2 = 6 examples a step: each row's stratum is its place in the keyed permutation of its
    step (seed, epoch, the step's place in the epoch), whichever micro-batch the row is in."""
    for seed, epoch in ((0, 0), (1, 0), (0, 1)):
        args = arguments(seed=seed, diffusion_t_sampler="stratified", per_device_train_batch_size=3)
        n = 3 * 2
        order = DataOrder()
        order.epoch = epoch
        tagged = [found[ROWS].strata for found in order.tag(args, [batch(3)] * 5)]
        rows = [stratum for micro_batch in tagged for stratum in micro_batch]
        expected = [window_strata(seed, epoch, step, n) for step in range(3)]
        assert rows == [(expected[p // n][p % n], n) for p in range(15)], (seed, epoch)

"""`impact`'s maskable counts against the batches a real DiffusionTrainer on the tiny model makes from the
same rows: TRL's preparation (EOS appended, completion mask, max_length truncation, dropped rows), the
Trainer's seeded sampler, right padding, and the release's response mask plus EOS tail. One trainer
build for the module."""

import numpy as np
import pytest
import torch

from unsloth_diffusion_norm.proof import experiment, fixtures
from unsloth_diffusion_norm.proof.tiny_model import words
from unsloth_diffusion_norm.tools import impact

BATCH, ACCUMULATION, MAX_LENGTH, SEED = 3, 2, 10, 11
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in __import__("trl").__version__.split(".")[:2]) < impact.TRL_FLOOR,
    reason="impact follows TRL 1.x's dataset preparation",
)


class TextRow:
    """A prompt/completion row in words of the tiny vocabulary (one token each); TRL tokenizes it."""

    def __init__(self, i):
        answer = 1 + (i * 7) % 9  # 1..9 words: ragged batches, and truncation at MAX_LENGTH for the long ones
        self.prompt, self.completion = words(10 + i % 5, 11), " " + words(*range(20, 20 + answer))

    def row(self):
        return {"prompt": self.prompt, "completion": self.completion}


ROWS = [TextRow(i) for i in range(22)]
# A prompt that fills max_length: TRL drops the row, impact must too.
ROWS.append(type("Long", (), {"row": lambda self: {"prompt": words(*range(30, 42)), "completion": " w20"}})())


@pytest.fixture(scope="module")
def trainer():
    setup = experiment.Setup.of(
        batch_size=BATCH, gradient_accumulation_steps=ACCUMULATION, seed=SEED, max_length=MAX_LENGTH
    )
    run = experiment.build(ROWS, setup, record=False)
    trainer = run.trainer
    del trainer._get_train_sampler  # build() keeps the given order; here the Trainer's own seeded sampler
    return trainer


def settings(world=1):
    return impact.Settings(
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        world_size=world,
        max_length=MAX_LENGTH,
        seed=SEED,
    )


def prepared(trainer):
    dataset = impact.load_rows_from_list([r.row() for r in ROWS])
    return impact.prepare(dataset, trainer.processing_class, settings())


def maskable(batch):
    """The release's maskable set per row: response_mask plus the EOS tail of rows with a response."""
    from unsloth.models.diffusion_profiles import response_mask

    mask = response_mask(batch)
    padding = ~batch["attention_mask"].bool()
    return (mask | (padding & mask.any(dim=1, keepdim=True))).sum(dim=1).tolist()


def test_the_prepared_rows_are_the_trainers_and_trls_own(trainer):
    mine = prepared(trainer)
    dataset = trainer.train_dataset
    assert mine.length.tolist() == [len(ids) for ids in dataset["input_ids"]]
    assert mine.supervised.tolist() == [sum(label != -100 for label in row) for row in dataset["labels"]]
    assert len(mine.length) == len(ROWS) - 1  # the long prompt's row dropped
    rows = impact.load_rows_from_list([r.row() for r in ROWS])
    length, supervised = impact._trl_route(rows, trainer.processing_class, settings(), True)
    assert (length.tolist(), supervised.tolist()) == (mine.length.tolist(), mine.supervised.tolist())
    tokenized = impact.load_rows_from_list(
        [{"input_ids": i, "labels": lab} for i, lab in zip(dataset["input_ids"], dataset["labels"])]
    )
    again = impact.prepare(tokenized, trainer.processing_class, settings())
    assert again.route == "batched" and again.supervised.tolist() == mine.supervised.tolist()


def test_maskable_counts_are_the_real_trainers_micro_batches(trainer):
    from transformers import set_seed

    set_seed(SEED)  # as train() does before it builds the dataloader (the sampler reads the seed then)
    batches = iter(trainer.get_train_dataloader())
    real, padded = [], []
    while True:
        window, _ = trainer.get_batch_samples(batches, ACCUMULATION, torch.device("cpu"))
        if not window:
            break
        real.append([maskable(batch) for batch in window])
        padded += [batch["input_ids"].shape[1] for batch in window]
    plan = impact.layout(prepared(trainer), settings())
    mine = [
        [plan.maskable[plan.micro_batch == mb].tolist() for mb in np.flatnonzero(plan.step_of_micro_batch == s)]
        for s in range(plan.steps)
    ]
    assert mine == real
    assert plan.padded.tolist() == padded  # P of the global RNG's draws
    assert plan.position.tolist() == [i for window in real for batch in window for i in range(len(batch))]
    assert plan.k.tolist() == [len(w) for w in real]  # the last window partial


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_accelerates_round_robin_deal(trainer, world):
    """Under data parallel, each rank's micro-batches as accelerate deals the Trainer's seeded order."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader, RandomSampler

    plan = impact.layout(prepared(trainer), settings(world))
    dataset = trainer._remove_unused_columns(trainer.train_dataset, description="training")
    for rank in range(world):
        loader = prepare_data_loader(
            DataLoader(dataset, batch_size=BATCH, sampler=RandomSampler(dataset), collate_fn=trainer.data_collator),
            num_processes=world,
            process_index=rank,
            put_on_device=False,
            use_seedable_sampler=True,
            data_seed=SEED,
        )
        batches = list(loader)
        real = [maskable(batch) for batch in batches]
        ours = np.flatnonzero(plan.rank == rank)  # in the rank's own order
        mine = [plan.maskable[plan.micro_batch == mb].tolist() for mb in ours]
        assert mine == real, rank
        assert plan.padded[ours].tolist() == [batch["input_ids"].shape[1] for batch in batches], rank
    assert fixtures.EPS == impact.Settings().diffusion_eps  # the Nemotron profile's default, in both places

"""Samples at each evaluation (opt-in): the first N examples of the eval set (`diffusion_eval_samples=N`), or
prompts of the run's own (`diffusion_eval_sample_prompts`), their answers decoded from all-[MASK] by
low-confidence remasking, written to `output_dir` and shown in TensorBoard (a text table) and W&B (a table).

The decoder (`decode`) is greedy: at each of its steps the model scores the still-masked answer positions, and
the most confident of them keep their argmax token, as many per step as LLaDA's schedule gives (the answer's
length spread evenly over the steps, the remainder to the first). Over the whole canvas at once, or block by block
as NVIDIA's model generates (`block`): each block denoised with the earlier ones fixed and the later ones not yet
in the sequence. A block-diffusion run's samples are decoded block by block at its block size, with the
bidirectional attention of the same weights (`block_attention.bidirectional`: the class its generate runs), and
say so. It draws nothing, so it reads no RNG, and it puts the model's mode back: a run with samples trains and
evaluates bitwise as one without. Every rank decodes (a sharded model's forward needs them all); the main process
writes.
"""

import json
import os

import torch

from . import block_attention, block_diffusion, config, construction
from .evaluation import global_rng_held

STEPS = 32  # decoding steps per sample (fewer where the answer is shorter: one token a step at the least)
PROMPT_ANSWER = 64  # tokens decoded after a prompt of the run's own (an eval example's answer has its own length),
# fewer where the run's max_length or the model's positions end sooner
FILE = "diffusion_samples.jsonl"  # in output_dir, one line per sample per evaluation
TEXT_TAG = "eval/samples"  # TensorBoard's text tab, and the W&B table's key
COLUMNS = ("step", "index", "prompt", "sample", "reference", "decoding")  # the W&B table's


def decoding_of(block):
    """A row's words for how it was decoded."""
    return "whole canvas" if block is None else f"block by block ({block} tokens)"


def transfer_counts(length, steps):
    """Tokens unmasked at each step: `length` spread over `steps`, the remainder one each to the first steps."""
    base, extra = divmod(length, steps)
    return [base + (1 if step < extra else 0) for step in range(steps)]


def decode(model, prompt, length, mask_id, steps=STEPS, shift=False, block=None):
    """The answer of `length` tokens after `prompt` (a list of ids), decoded by greedy low-confidence remasking in
    min(steps, length) steps; a list of ids. `shift`: position i's logits predict token i + 1. `block`: block by
    block, `block` tokens each (the last may be shorter), the steps spread over the blocks (one each at least)."""
    return decode_rows(model, [prompt], length, mask_id, steps, shift, block)[0]


def blocks(length, block):
    """[(first, end)] of the answer's blocks: one over the whole canvas where `block` is None."""
    size = block or max(length, 1)
    return [(first, min(first + size, length)) for first in range(0, length, size)]


def decode_rows(model, prompts, length, mask_id, steps=STEPS, shift=False, block=None):
    """`decode` for prompts of one length at once, each row on its own (one forward per step for all of them)."""
    device = next(model.parameters()).device
    tokens = torch.tensor([list(prompt) for prompt in prompts], dtype=torch.long, device=device)
    start = len(prompts[0])
    spans = blocks(length, block)
    shares = transfer_counts(max(steps, len(spans)), len(spans)) if spans else []
    for (first, end), block_steps in zip(spans, shares):
        width = end - first  # the block's masks appended: the later blocks are not in the sequence yet
        tokens = torch.cat([tokens, torch.full((len(prompts), width), mask_id, dtype=torch.long, device=device)], 1)
        at = start + first
        still = torch.ones(len(prompts), width, dtype=torch.bool, device=device)  # (a decoded token may be the mask)
        for count in transfer_counts(width, max(1, min(block_steps, width))):
            output = model(input_ids=tokens)
            logits = (output.logits if hasattr(output, "logits") else output[0]).float()
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            confidence, choice = logits[:, at:].softmax(dim=-1).max(dim=-1)
            best = confidence.masked_fill(~still, -1.0).topk(count, dim=-1).indices  # (probabilities are >= 0)
            tokens[:, at:] = tokens[:, at:].scatter(1, best, choice.gather(1, best))
            still.scatter_(1, best, False)
    return tokens[:, start:].tolist()


def prompts(dataset, count):
    """[(prompt ids, reference answer ids)] of the first `count` examples of an eval set: a Dataset, an
    IterableDataset (streamed) or a dict of them (the first). The answer is where the row is supervised: its
    labels other than -100, else its completion_mask (TRL's)."""
    import itertools

    if isinstance(dataset, dict):
        dataset = next(iter(dataset.values()))
    found = []
    for row in itertools.islice(iter(dataset), count):
        ids = list(row["input_ids"])
        if row.get("labels") is not None:
            answer = [label != -100 for label in row["labels"]]
        else:
            answer = [bool(m) for m in row.get("completion_mask") or [0] * len(ids)]
        if not any(answer):
            found.append((ids, []))
            continue
        first = answer.index(True)
        found.append((ids[:first], [t for t, a in zip(ids[first:], answer[first:]) if a]))
    return found


def attach(trainer):
    """Add the sample callback to a trainer whose run asks for samples (config.check_samples checked the ask)."""
    if config.EVAL_SAMPLES.of(trainer.args) or config.SAMPLE_PROMPTS.of(trainer.args):
        trainer.add_callback(_callback_class()(trainer))


def _callback_class():
    from transformers import TrainerCallback  # (here: `import unsloth_diffusion_norm` stays free of transformers)

    class DiffusionSamples(TrainerCallback):
        """At each evaluation: the first N eval examples decoded, written, shown."""

        def __init__(self, trainer):
            self.trainer = trainer

        def on_evaluate(self, args, state, control, **kwargs):
            rows = samples_of(self.trainer)
            if not state.is_world_process_zero:
                return
            with open(os.path.join(args.output_dir, FILE), "a", encoding="utf-8") as out:
                for row in rows:
                    out.write(json.dumps({"step": state.global_step, **row}) + "\n")
            for callback in self.trainer.callback_handler.callbacks:
                writer = getattr(callback, "tb_writer", None)
                if writer is not None:  # TensorBoardCallback, once its writer is open
                    writer.add_text(TEXT_TAG, table(rows), state.global_step)
                wandb = getattr(callback, "_wandb", None)
                if wandb is not None and getattr(wandb, "run", None) is not None:  # WandbCallback, its run started
                    data = [[state.global_step, *(row[name] for name in COLUMNS[1:])] for row in rows]
                    # (as WandbCallback.on_log logs: the step under train/global_step)
                    wandb.log(
                        {
                            TEXT_TAG: wandb.Table(columns=list(COLUMNS), data=data),
                            "train/global_step": state.global_step,
                        }
                    )

    return DiffusionSamples


def samples_of(trainer):
    """[{index, prompt, sample, reference, tokens}] of the run's samples, decoded now: the run's own prompts (no
    reference; PROMPT_ANSWER tokens each), else the first diffusion_eval_samples eval examples."""
    model, args, profile = trainer.model, trainer.args, trainer.diffusion_profile
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # (a processor's text tokenizer)
    given = config.SAMPLE_PROMPTS.of(args)
    if given:
        asked = [(tokenizer(text)["input_ids"], None) for text in given]
    else:
        asked = prompts(trainer.eval_dataset, config.EVAL_SAMPLES.of(args))
    mask_id, _ = profile._token_ids(model, args)
    model_config = construction.model_config(model)
    run_block = block_diffusion.of_config(model_config, args)
    block = run_block.block_size if run_block is not None else None
    was_training = model.training
    model.eval()
    rows = []
    try:
        with torch.no_grad(), global_rng_held(args.device), block_attention.bidirectional(model, model_config):
            for index, (prompt, reference) in enumerate(asked):
                length = _room(model, args, prompt) if reference is None else len(reference)
                tokens = decode(model, prompt, length, mask_id, STEPS, profile.shift_logits, block) if length else []
                rows.append(
                    {
                        "index": index,
                        "prompt": tokenizer.decode(prompt),
                        "sample": tokenizer.decode(tokens),
                        "reference": None if reference is None else tokenizer.decode(reference),
                        "tokens": tokens,
                        "decoding": decoding_of(block),
                    }
                )
    finally:
        model.train(was_training)
    return rows


def _room(model, args, prompt):
    """PROMPT_ANSWER, or what fits after `prompt` in the run's max_length and the model's positions."""
    limits = [
        getattr(args, "max_length", None),
        getattr(getattr(model, "config", None), "max_position_embeddings", None),
    ]
    room = min([PROMPT_ANSWER] + [limit - len(prompt) for limit in limits if isinstance(limit, int)])
    return max(room, 0)


def table(rows):
    """The samples as a Markdown table (TensorBoard renders it in its text tab)."""
    cell = lambda text: (text or "").replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| # | prompt | sample | reference | decoding |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['index']} | {cell(r['prompt'])} | {cell(r['sample'])} | {cell(r['reference'])} | {r.get('decoding')} |"
        for r in rows
    ]
    return "\n".join(lines)

"""Fine-tune a Nemotron-Labs-Diffusion checkpoint with Unsloth's DiffusionTrainer and the window-normalized
masked-diffusion loss: a TRL-style script, configured from the command line or a YAML file.

    python examples/train.py --config examples/train.yaml
    python examples/train.py --model_name_or_path ./Nemotron-Labs-Diffusion-8B --trust_remote_code \
        --dataset_name data.jsonl --output_dir out --gradient_accumulation_steps 8 \
        --diffusion_loss_normalization window

Command-line arguments override the YAML file. The dataset is a local JSON-lines file (or a directory
`datasets.load_from_disk` reads, or a hub name) of prompt/completion rows; `--dataset_streaming` reads it
as a stream (then give --max_steps). Everything else is TRL's ScriptArguments, Unsloth's DiffusionConfig
(TRL's SFTConfig plus the diffusion knobs and this plugin's flags) and TRL's ModelConfig.
"""

# The order of these imports is the point (isort: split keeps the linter from sorting it away).
import unsloth_diffusion_norm  # before Unsloth: the one line the plugin asks for

# isort: split
from unsloth import FastModel  # before TRL and transformers, as Unsloth asks
from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

# isort: split
import contextlib
import os
import sys

import torch
from datasets import load_dataset, load_from_disk
from trl import ModelConfig, ScriptArguments, TrlParser


def load_data(script_args, split=None):
    name, streaming = script_args.dataset_name, getattr(script_args, "dataset_streaming", False)
    if name.endswith((".json", ".jsonl")):
        dataset = load_dataset("json", data_files=name, streaming=streaming)
    elif os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        dataset = load_from_disk(name)
    else:
        dataset = load_dataset(name, getattr(script_args, "dataset_config", None), streaming=streaming)
    split = split or script_args.dataset_train_split
    if split not in dataset:  # (a one-file JSON set has a train split alone: say which to name)
        sys.exit(f"train.py: {name} has no split {split!r}; it has {', '.join(dataset)} (dataset_test_split names one)")
    return dataset[split]


def main(script_args, training_args, model_args):
    status = unsloth_diffusion_norm.status()  # print(status) lists every patch
    print(f"unsloth_diffusion_norm: {status.mode} on Unsloth {status.unsloth_version}")
    # TRL moved these between ModelConfig and SFTConfig across releases: take them where they are.
    dtype = getattr(model_args, "dtype", None) or getattr(model_args, "torch_dtype", None)
    remote_code = getattr(model_args, "trust_remote_code", None) or getattr(training_args, "trust_remote_code", False)
    # --use_cpu: the model on the CPU too (under torchrun Unsloth would place it on cuda:LOCAL_RANK).
    placement = {"device_map": {"": "cpu"}} if training_args.use_cpu else {}
    model, tokenizer = FastModel.from_pretrained(
        model_args.model_name_or_path,
        trust_remote_code=remote_code,
        dtype=None if dtype in (None, "auto") else getattr(torch, dtype),
        **placement,
    )
    if model_args.use_peft:
        model = FastModel.get_peft_model(
            model,
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules or ["q_proj", "k_proj", "v_proj", "o_proj"],
        )
    evaluates = training_args.eval_strategy != "no"  # then the dataset's test split is the eval set
    train_dataset = load_data(script_args)
    eval_dataset = load_data(script_args, script_args.dataset_test_split) if evaluates else None
    with refused_in_one_line():  # a flag this trainer cannot honour (e.g. the plugin switched off)
        trainer = DiffusionTrainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
        )
    print(
        f"diffusion_loss_normalization={training_args.diffusion_loss_normalization!r}, "
        f"diffusion_noise={training_args.diffusion_noise!r}, "
        f"diffusion_eval_noise={training_args.diffusion_eval_noise!r}, profile {trainer.diffusion_profile.name} "
        f"({trainer.diffusion_profile.loss_normalization})"
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.save_state()


@contextlib.contextmanager
def refused_in_one_line():
    """A configuration refused where it is checked (ValueError: flags that contradict each other, a flag the
    switched-off plugin cannot honour) is one line on stderr and exit status 2, as argparse's own errors are."""
    try:
        yield
    except ValueError as error:
        print(f"{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, DiffusionConfig, ModelConfig))
    with refused_in_one_line():  # DiffusionConfig checks its flags together when the parser builds it
        arguments = parser.parse_args_and_config()
    main(*arguments)

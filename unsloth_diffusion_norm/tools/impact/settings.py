"""The run's settings that decide the counts, the keys of a training config impact reads, and `Unusable`,
the one-line refusal of input impact cannot use."""

import dataclasses
from dataclasses import dataclass

from ..console import USAGE, Failure


class Unusable(Failure, ValueError):
    """Input impact cannot work from; the message is one line for the user (the command line exits 2)."""

    code = USAGE


@dataclass
class Settings:
    """The run's settings that decide the counts. Defaults are the trainer's own: transformers'
    TrainingArguments (batch 8, accumulation 1, seed 42), TRL's SFTConfig (max_length 1024, keep_start),
    the Nemotron profile's diffusion_eps (1e-3)."""

    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    world_size: int = 1
    diffusion_eps: float = 1e-3
    max_length: int | None = 1024
    seed: int = 42
    data_seed: int | None = None
    truncation_mode: str = "keep_start"
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False
    dataset_text_field: str = "text"
    pad_to_multiple_of: int | None = None
    shuffle_dataset: bool = False
    dataloader_drop_last: bool = False
    train_sampling_strategy: str = "random"
    dataset_num_proc: int | None = None

    def check(self):
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise Unusable(f"{name} must be a whole number of at least 1, not {value!r}")
        for name in ("max_length", "pad_to_multiple_of"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise Unusable(f"{name} must be a whole number of at least 1 (or none), not {value!r}")
        eps = self.diffusion_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise Unusable(f"diffusion_eps must be a number in [0, 1), not {eps!r}")
        if self.truncation_mode not in ("keep_start", "keep_end"):
            raise Unusable(f"truncation_mode must be 'keep_start' or 'keep_end', not {self.truncation_mode!r}")
        if self.train_sampling_strategy not in ("random", "sequential"):
            raise Unusable(
                f"train_sampling_strategy={self.train_sampling_strategy!r} is not modelled "
                "(impact knows 'random', the default, and 'sequential')"
            )
        return self


# The keys of a training YAML (examples/train.yaml) impact reads; every other key is the script's business.
CONFIG_KEYS = {f.name for f in dataclasses.fields(Settings)} | {
    "dataset_name",
    "dataset_train_split",
    "model_name_or_path",
    "tokenizer_name_or_path",
}


# The settings that decide how a step is cut (how many micro-batches, how many masked tokens each): when one
# is neither in --config nor given as an option, the trainer's default stands in for it and impact says so
# (a run at batch 1 x accumulation 8 read as the default 8 x 1 shows nothing moved).
# A config that leaves one out trains with the same default; only world_size, a launch setting, is never in it.
DECISIVE = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "world_size",
    "diffusion_eps",
    "max_length",
    "seed",
)


def read_config(path):
    """The keys impact reads from a training YAML (or JSON) config, as a dict."""
    return {k: v for k, v in load_config(path).items() if k in CONFIG_KEYS}


def load_config(path):
    """A training YAML (or JSON) config, every key, as a dict; Unusable, one line, when it is not one."""
    import yaml

    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except OSError as error:
        raise Unusable(f"cannot read the config {path!r}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise Unusable(f"the config {path!r} is not YAML: {' '.join(str(error).split())}") from None
    if not isinstance(loaded, dict):
        raise Unusable(f"the config {path!r} is not a mapping of settings")
    return loaded


def from_command_line(args):
    """(settings, data, tokenizer, split, defaulted) of `impact`'s command line: the --config file's keys, then
    the options, then the trainer's defaults; `defaulted`: {setting: value} of the DECISIVE settings that came
    from those defaults."""
    config = read_config(args.config) if args.config else {}
    chosen = {k: v for k, v in config.items() if k in Settings.__dataclass_fields__}
    options = {
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": args.world_size,
        "diffusion_eps": args.diffusion_eps,
        "seed": args.seed,
    }
    chosen.update({k: v for k, v in options.items() if v is not None})
    if "max_length" in vars(args):
        chosen["max_length"] = args.max_length
    if chosen.get("diffusion_eps") is None:
        chosen.pop("diffusion_eps", None)  # the YAML's null: the profile's default
    data = args.data or config.get("dataset_name")
    tokenizer = args.tokenizer or config.get("tokenizer_name_or_path") or config.get("model_name_or_path")
    if not data:
        raise Unusable("give --data FILE (or a --config with dataset_name)")
    if not tokenizer:
        raise Unusable("give --tokenizer DIR (or a --config with model_name_or_path)")
    try:
        settings = Settings(**chosen).check()
    except (TypeError, Unusable) as error:
        raise Unusable(f"{args.config}: {error}" if args.config else str(error)) from None
    defaulted = {name: getattr(settings, name) for name in DECISIVE if name not in chosen}
    return settings, data, tokenizer, args.split or config.get("dataset_train_split") or "train", defaulted

"""The sharded engines - FSDP2 through accelerate, DeepSpeed ZeRO-2 and ZeRO-3 - as launched ranks use
them: the launch command and environment, what a rank sets up before its trainer, how it reads whole
gradients and parameters, and what the engine really did to the model.

CPU-only enabling pieces - here, in the proof harness, never in the plugin:
- accelerate turns FSDP on only for the GPU-family distributed types (`accelerate/state.py`); on a CPU host
  it trains plain DDP without a word. `fsdp_on_cpu()` wraps `AcceleratorState.__init__` so that a state given
  an FSDP plugin on `MULTI_CPU` becomes `FSDP`, as it would on GPUs.
- `DS_ACCELERATOR=cpu` (DeepSpeed's CPU accelerator; Gloo, no oneCCL) in the launched environment, and
  `skip_shared_memory_op()`: that accelerator's inference-only op is not compiled in each rank.
- `use_cpu=True` in the training arguments (every run of `experiment.train`): without it DeepSpeed gets no
  backend and trains every rank on all the data.
- The launchers spawn one process per rank only for the GPU distributed types, so the config files say
  `use_cpu: false`; the script's `use_cpu=True` makes the processes CPU ones.
"""

import importlib.util
import json
import os
import sys
from dataclasses import dataclass

# The tiny model's decoder layer: each is its own FSDP unit, as accelerate's transformer policy does it.
LAYER = "DecoderLayer"

FSDP2_YAML = f"""\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_machines: 1
mixed_precision: 'no'
use_cpu: false
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: {LAYER}
  # FULL_STATE_DICT fails on CPU when the Trainer saves (safetensors: "invalid python storage"), any model
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_reshard_after_forward: true
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
"""


def zero_config(stage):
    """The DeepSpeed config: "auto" values are filled in from the training arguments by transformers
    (so gradient_accumulation_steps follows each case)."""
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # torch SGD, as in every other run here
    }


ZERO3_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_machines: 1
use_cpu: false
deepspeed_config:
  deepspeed_config_file: {config}
  zero3_init_flag: false
"""


@dataclass
class Engine:
    name: str
    launcher: str  # "torchrun" or "accelerate"
    accelerate_yaml: str = None  # the --config_file (a template for {config}: the DeepSpeed JSON)
    deepspeed: dict = None  # the DeepSpeed JSON: the yaml's file, or `deepspeed=` under torchrun

    @property
    def uses_deepspeed(self):
        return self.deepspeed is not None

    @property
    def training_args(self):
        """What the user's script adds to its training arguments for this engine."""
        return {"deepspeed": self.deepspeed} if self.uses_deepspeed and self.launcher == "torchrun" else {}


ENGINES = {
    "fsdp2": Engine("fsdp2", "accelerate", accelerate_yaml=FSDP2_YAML),
    "zero2": Engine("zero2", "torchrun", deepspeed=zero_config(2)),
    "zero3": Engine("zero3", "accelerate", accelerate_yaml=ZERO3_YAML, deepspeed=zero_config(3)),
}


def deepspeed_available():
    # Not imported here: importing DeepSpeed probes for an accelerator and says so.
    return importlib.util.find_spec("deepspeed") is not None


def fsdp_on_cpu():
    """CPU-only enabling piece (harness only): accelerate keeps MULTI_CPU and drops the FSDP plugin on a
    CPU host (state.py turns FSDP on for the GPU-family types only); make the state FSDP, as on GPUs."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "fsdp_on_cpu", False):
        return

    def __init__(self, *pos, fsdp_plugin=None, **kw):
        original(self, *pos, fsdp_plugin=fsdp_plugin, **kw)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    __init__.fsdp_on_cpu = True
    AcceleratorState.__init__ = __init__


def prepare(engine):
    """In each launched process, before any trainer is built."""
    if engine.name == "fsdp2":
        fsdp_on_cpu()
    if engine.uses_deepspeed:
        skip_shared_memory_op()


def skip_shared_memory_op():
    """CPU-only piece (harness only): DeepSpeed's CPU accelerator JIT-compiles a shared-memory op when its
    backend starts (about a minute on 2 cores, in every fresh environment), used by `inference_all_reduce`
    alone; training all-reduces through torch.distributed (Gloo) either way."""
    import importlib

    # By module path: the attribute `deepspeed.comm.torch` is the torch library that package re-exports.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def gathered(engine):
    """The context in which a model's parameters are whole (ZeRO-3 partitions them; FSDP2's DTensors are
    made whole per tensor by experiment.whole)."""
    if engine.name != "zero3":
        import contextlib

        return contextlib.nullcontext

    def whole_parameters(model):
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()))

    return whole_parameters


def record_with(engine):
    """DeepSpeed steps inside accelerator.backward, before Trainer's on_pre_optimizer_step, and keeps the
    gradients in its partitions: read every whole gradient as the engine's step begins."""
    if not engine.uses_deepspeed:
        return None

    def attach(trainer, run):
        from transformers import TrainerCallback

        class EngineGradients(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                engine_ = trainer.model_wrapped
                step = engine_.step

                def recorded_step(*pos, **kwargs):
                    from deepspeed.utils import safe_get_full_grad

                    from .experiment import whole

                    run.windows[-1].grads = {
                        n: whole(safe_get_full_grad(p)) for n, p in trainer.model.named_parameters() if p.requires_grad
                    }
                    return step(*pos, **kwargs)

                engine_.step = recorded_step

        trainer.add_callback(EngineGradients())

    return attach


def layout(engine, trainer):
    """What the engine really did to the model, in words and as a yes/no (accelerate falls back to DDP
    on CPU without a word): the wrapper, and whether parameters / gradients are sharded."""
    import torch.distributed as dist

    wrapper = type(trainer.model_wrapped).__name__
    params = [p for p in trainer.model.parameters()]
    world = dist.get_world_size()
    if engine.name == "fsdp2":
        sharded = [p for p in params if type(p).__name__ == "DTensor" and p.device_mesh.size() == world]
        on = wrapper.startswith("FSDP") and len(sharded) == len(params)
        return on, f"{wrapper}: {len(sharded)}/{len(params)} parameters DTensor-sharded over {world} ranks"
    stage = trainer.model_wrapped.zero_optimization_stage() if wrapper == "DeepSpeedEngine" else None
    want = int(engine.name[-1])
    if stage == 3:
        partitioned = [p for p in params if hasattr(p, "ds_tensor") and p.numel() == 0]
        on = stage == want and len(partitioned) == len(params)
        return on, f"{wrapper} ZeRO-3: {len(partitioned)}/{len(params)} parameters partitioned over {world} ranks"
    partitions = getattr(trainer.model_wrapped.optimizer, "partition_count", None)
    on = stage == want and partitions is not None and set(partitions) == {world}
    return on, f"{wrapper} ZeRO-{stage}: gradients and optimizer state in {partitions} partitions"


def command(engine, ranks, workdir):
    """The launch command for `engine` (the worker module and its arguments are appended)."""
    if engine.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    config = os.path.join(workdir, f"{engine.name}.yaml")
    text = engine.accelerate_yaml
    if engine.deepspeed is not None:
        ds = os.path.join(workdir, f"{engine.name}.json")
        with open(ds, "w") as f:
            json.dump(engine.deepspeed, f, indent=1)
        text = text.format(config=ds)
    with open(config, "w") as f:
        f.write(text)
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        config,
        f"--num_processes={ranks}",
        "--main_process_port=0",
    ]


def environment(engine):
    # CPU-only enabling piece: DeepSpeed's CPU accelerator (Gloo) instead of probing for CUDA.
    return {"DS_ACCELERATOR": "cpu"} if engine.uses_deepspeed else {}

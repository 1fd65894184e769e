"""Instruments attached to a live trainer: they observe, never change what is computed."""

import sys
import time

# A collective issued by the library code while a window is fetched or trained on. DDP's gradient
# all-reduce runs inside its C++ reducer and logging's loss gather runs outside the step: neither counts.
# Nor do a sharding engine's own parameter and gradient collectives (issued from these packages).
ENGINE_PACKAGES = ("torch.distributed.fsdp", "torch.distributed.tensor", "deepspeed")


COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "broadcast",
    "reduce",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
)


class CollectiveCounter:
    """Counts torch.distributed collectives per window: from each get_batch_samples call to the next."""

    def __init__(self):
        self.per_window = []
        self.active = False
        self.originals = {}
        self.trainer = None

    def attach(self, trainer):
        """Count for this trainer (a later one replaces an earlier one, e.g. when a run is resumed)."""
        import torch.distributed as dist

        self.trainer, self.per_window = trainer, []
        if not self.originals:
            for name in COLLECTIVES:
                self.originals[name] = original = getattr(dist, name)
                setattr(dist, name, self._counted(original))
        for method in ("get_batch_samples", "training_step"):
            setattr(trainer, method, self._active(getattr(trainer, method), new_window=method == "get_batch_samples"))

    def detach(self):
        import torch.distributed as dist

        for name, original in self.originals.items():
            setattr(dist, name, original)
        for method in ("training_step",):  # get_batch_samples stays the recorder's view
            if self.trainer is not None:
                self.trainer.__dict__.pop(method, None)

    def _counted(self, original):
        def collective(*pos, **kw):
            if self.active and not _from_engine(sys._getframe(1)):
                self.per_window[-1] += 1
            return original(*pos, **kw)

        return collective

    def _active(self, method, new_window):
        def view(*pos, **kw):
            if new_window:
                self.per_window.append(0)
            self.active = True
            try:
                return method(*pos, **kw)
            finally:
                self.active = False

        return view


def _from_engine(frame):
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(ENGINE_PACKAGES):
            return True
        frame = frame.f_back
    return False


class StepClock:
    """Times between consecutive optimizer-step ends (fetch, noise, forward, backward, optimizer)."""

    def __init__(self):
        self.ends = []

    def attach(self, trainer):
        import torch
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if args.device.type != "cpu":  # an accelerator runs behind the host: wait for its step
                    getattr(torch, args.device.type).synchronize()
                clock.ends.append(time.perf_counter())

        trainer.add_callback(Clock())

    def steps(self):
        return [b - a for a, b in zip(self.ends, self.ends[1:])]  # the first step is warm-up

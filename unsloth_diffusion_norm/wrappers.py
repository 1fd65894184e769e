"""The one contract every patch's wrapper follows, class-level or per-trainer, and the `Release` context it
is given.

A wrapper is `function(*context, wrapped, instance, args, kwargs)` (wrapt's contract) and passes the caller's
arguments on, only those it must replace replaced: a keyword a later release adds reaches the original.
"""

import dataclasses
import functools

import wrapt

from . import noise


@dataclasses.dataclass(frozen=True)
class Release:
    """What the wrappers need of the installed Unsloth."""

    shape: str  # None for the flags-only set
    trainer_module: object
    masked_module: object = None
    profiles_module: object = None
    disabled_by: str = None  # the flags-only set: what turned the plugin off

    def draw(self, profile, model, inputs, args, rows=None):
        """The release's noise for `inputs`; keyed by `rows` (per_sample.Rows) when given."""
        keys, strata = (None, None) if rows is None else (rows.keys, rows.strata)
        return noise.draw(profile, model, inputs, args, self.masked_module.response_mask, keys, strata)


def wrap(function, *context):
    """A class-level Patch's `make`: what is there now, wrapped as `function(*context, wrapped, instance, args, kwargs)`."""
    return lambda current: wrapt.FunctionWrapper(current, functools.partial(function, *context))


def wrap_method(owner, function, *context):
    """A per-trainer Patch's `make`, with wrap's contract; `instance` is `owner` (the trainer or its profile
    copy), `wrapped` its bound method. A plain function, not a wrapt proxy: a proxy refuses deepcopy."""

    def make(current):
        @functools.wraps(current)
        def method(*pos, **kwargs):
            return function(*context, current, owner, pos, kwargs)

        return method

    return make


# What a wrapper reads of a call, by the release's parameter names (Trainer's, the profile's); whatever else
# the caller passes is the original's business, never an error here.
def batch_samples_arguments(epoch_iterator, num_batches, *_, **__):
    return epoch_iterator, num_batches


def log_arguments(logs, *_, **__):
    return logs


def loss_arguments(model, inputs, args, num_items_in_batch=None, *_, **__):
    return model, inputs, args, num_items_in_batch


def prediction_arguments(model, inputs, *_, **__):
    return model, inputs


def evaluation_loop_arguments(
    dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval", *_, **__
):
    return metric_key_prefix


def prepare_arguments(model, inputs, args, *_, **__):
    return model, inputs, args


def replaced(pos, kwargs, index, name, value):
    """(pos, kwargs) with the parameter `name` (at `index`) set to `value`, where the caller passed it."""
    if index < len(pos):
        return (*pos[:index], value, *pos[index + 1 :]), kwargs
    return pos, {**kwargs, name: value}

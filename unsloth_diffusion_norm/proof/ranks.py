"""Launched ranks: what each process of a data-parallel or sharded run does (train one case, record its
windows, judge itself against the oracle over all ranks' data), and how the processes are launched.

    python -m unsloth_diffusion_norm.proof.ranks --worker ...   # inside a launched process (see `launch`)
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, replace

from ..registry import NATIVE
from . import engines, fixtures, processes
from .dp_cases import CASES, SHARDED, Case
from .instruments import CollectiveCounter

EVAL_SEED = 1234


@dataclass
class RankResult:
    case: str
    rank: int
    ranks: int
    counts: list  # window -> rank -> realized masked tokens per micro-batch
    logged_loss: list
    reference_loss: list
    grad_error: float
    param_error: float
    worst: float
    collectives: list  # per window
    model_wrapped: str
    eval_loss: float = None
    eval_reference: float = None
    eval_unpatched: float = None
    # diffusion_eval_noise="fixed" (a case's eval_noise): a second evaluation of the same weights; the largest
    # |parameter difference| between the run evaluating at every step and the same run without evaluation, with
    # the field set and unset; whether this rank's m-th evaluation batch was the eval set's example m·W + rank.
    eval_again: float = None
    eval_training_difference: float = None
    eval_training_difference_unset: float = None
    eval_positions_ok: bool = None
    # The same case with two keyed draws per example: the logged spread between them, and the oracle's.
    eval_spread: float = None
    eval_spread_reference: float = None
    # ... and its accuracy and masked CE by noise level, {name: value} logged and the oracle's over every rank's draws.
    eval_scores: dict = None
    eval_scores_reference: dict = None
    resume_difference: float = None  # max |param| between the resumed and the uninterrupted run
    checkpoint: list = None  # the files of the checkpoint a run resumed from
    noise_levels: list = None  # window -> micro-batch -> p_mask of each row, on this rank
    # The largest |logged - oracle| of the windows' metrics (metrics.py) over the windows that logged them; None:
    # no window did. Within tolerance, as `worst` says.
    metrics_error: float = None
    sample_masks: dict = None  # per-sample noise: generator seed -> (own tokens, masked)
    engine: str = None  # engines.ENGINES name; None: DDP
    engine_on: bool = None  # the engine really wraps and shards the model
    layout: str = None  # what it did, in words
    # On a natively fixed release, for a case at the default settings: the largest |parameter difference|
    # to the same run under Unsloth's own training path (unpatched()); 0.0 = bitwise Unsloth's own.
    upstream_difference: float = None
    notes: list = None  # what the plugin logged on this rank while the case's trainers were built and trained
    local_rank: int = None  # LOCAL_RANK, as the launcher set it
    ok: bool = False


def run_case(name, case, engine=None):
    """Train one case on this rank (under an engines.ENGINES engine, or DDP); every rank returns its own
    RankResult."""
    import torch.distributed as dist

    _prepare(case)
    counter = CollectiveCounter()
    settings = _settings(case, counter, engine)
    trained = _train(name, case, settings, counter)
    upstream = _upstream_difference(case, settings, trained.uninterrupted)
    run = trained.run
    trainer = run.trainer
    world, rank = dist.get_world_size(), dist.get_rank()
    assert world == case.ranks, f"{name}: launched with {world} ranks, the case needs {case.ranks}"

    seen = [None] * world
    dist.all_gather_object(seen, [(w.batches, w.rng_state) for w in run.windows])
    result = RankResult(
        case=name,
        rank=rank,
        ranks=world,
        **_judged(run, seen, rank, rank_local=not case.average_tokens_across_devices, case=case),
        collectives=counter.per_window,
        model_wrapped=type(trainer.model_wrapped).__name__,
        resume_difference=trained.resume_difference,
        checkpoint=trained.checkpoint,
        upstream_difference=upstream,
        notes=trained.notes,
        local_rank=int(os.environ.get("LOCAL_RANK", -1)),
    )
    if engine is not None:
        result.engine = engine.name
        result.engine_on, result.layout = engines.layout(engine, trainer)
    if case.evaluate:
        (_fixed_evaluation(result, case, settings, run, world) if case.eval_noise else _evaluate(result, run, world))
    result.ok = result.worst <= 1.0
    return result


def _prepare(case):
    """The plugin applied; for a case that asks for it, Unsloth's own gradient-accumulation Trainer."""
    import unsloth_diffusion_norm

    unsloth_diffusion_norm.apply()
    if case.unsloth_ga_trainer:
        import transformers
        from unsloth.models._utils import patch_gradient_accumulation_fix

        patch_gradient_accumulation_fix(transformers.Trainer)
        assert transformers.Trainer.get_batch_samples.__name__ == "_unsloth_get_batch_samples"


def _settings(case, counter, engine):
    """The keywords of the case's experiment.train, counting its collectives with `counter`."""
    settings = dict(
        gradient_accumulation_steps=case.gradient_accumulation_steps,
        seed=case.seed,
        eval_examples=case.examples() if case.evaluate else None,
        average_tokens_across_devices=case.average_tokens_across_devices,
        before_train=counter.attach,
    )
    if case.lora is not None:
        settings["lora"] = case.lora
    if engine is not None:
        settings.update(
            engine.training_args, gathered=engines.gathered(engine), record_with=engines.record_with(engine)
        )
    if case.diffusion_noise is not None:
        settings["diffusion_noise"] = case.diffusion_noise
    if case.t_sampler is not None:
        settings["diffusion_t_sampler"] = case.t_sampler
    if case.complementary:
        settings["diffusion_complementary_masks"] = True
    if case.eps is not None:
        settings["diffusion_eps"] = case.eps
    if not case.inverse_t:
        settings["diffusion_time_weighting"] = "none"
    if case.max_grad_norm:
        settings["max_grad_norm"] = case.max_grad_norm
    if case.eval_noise is not None:
        settings.update(diffusion_eval_noise=case.eval_noise, eval_strategy="steps", eval_steps=1)
    if case.model_config:  # the tiny checkpoint with these config fields (each rank writes its own copy)
        settings["checkpoint"] = fixtures.write_tiny_checkpoint(fixtures.scratch("udn-ckpt-"), **case.model_config)
    return settings


@dataclass
class Trained:
    """A case trained on this rank: the run judged, the run without a resume, and what a resume adds."""

    run: object
    uninterrupted: object  # the resume cases' full run; otherwise `run`
    resume_difference: float = None
    checkpoint: list = None
    notes: list = None


def _train(name, case, settings, counter):
    """Train the case (and, for a resume case, resume it from its checkpoint); the plugin's notes meanwhile."""
    from . import experiment

    train = experiment.train if case.patched else experiment.train_per_micro_batch
    notes = Notes()
    try:
        if case.resume_at:
            # The launcher's working directory is shared by the ranks: the checkpoint goes there.
            workdir = os.path.join(os.getcwd(), name)
            runs = experiment.train_and_resume(case.examples(), case.resume_at, workdir, **settings)
            saved = os.path.join(workdir, "full", f"checkpoint-{case.resume_at}")
            checkpoint = sorted(os.path.relpath(os.path.join(d, f), saved) for d, _, fs in os.walk(saved) for f in fs)
            trained = Trained(runs.resumed, runs.full, runs.difference, checkpoint)
        else:
            run = train(case.examples(), **settings)
            trained = Trained(run, run)
    finally:
        counter.detach()
        notes.detach()
    trained.notes = notes.lines
    return trained


def _upstream_difference(case, settings, uninterrupted):
    """On a natively fixed release, for a case at the default settings: the largest |parameter difference|
    of the uninterrupted run to the same run under Unsloth's own training path; None elsewhere."""
    import unsloth_diffusion_norm

    from . import experiment

    if not (
        unsloth_diffusion_norm.status().mode == NATIVE
        and case.patched
        and case.plain()
        and not (case.diffusion_noise or case.model_config or case.eval_noise or case.complementary)
    ):
        return None
    # The plugin's default there must be bitwise Unsloth's own in an uninterrupted run.
    settings.pop("before_train")
    with unsloth_diffusion_norm.unpatched():
        own = experiment.train(case.examples(), **settings)
    return experiment.divergence(uninterrupted, own)


def _judged(run, seen, rank, rank_local, case):
    """The RankResult fields of every window judged against the oracle over `seen`, every rank's
    (batches, rng_state) of each window: masked counts, noise levels, losses and the worst errors."""
    from . import judging

    # The case's objective and step (mask pairs: the oracle builds them too; clipping: it clips as torch does).
    settings = judging.OracleSettings(
        complementary=case.complementary, inverse_t=case.inverse_t, max_grad_norm=case.max_grad_norm, block=case.block()
    )
    if case.eps is not None:
        settings = replace(settings, eps=case.eps)
    verdicts = [
        judging.judge(run, window, settings, ranks=[r[i] for r in seen], rank_local=rank_local)
        for i, window in enumerate(run.windows)
    ]
    return dict(
        counts=[
            [[int(m.masked.sum()) for m in judging.realized(*r[i])] for r in seen] for i in range(len(run.windows))
        ],
        noise_levels=[judging.noise_levels(*window) for window in seen[rank]],
        sample_masks=(
            {str(k): v for k, v in judging.masks_by_sample(seen[rank]).items()}
            if any(batch.get("keys") is not None for window in run.windows for batch in window.batches)
            else None
        ),
        logged_loss=[w.logged_loss for w in run.windows],
        metrics_error=max((v.metrics_error for v in verdicts if v.metrics_error is not None), default=None),
        reference_loss=[v.reference_loss for v in verdicts],
        grad_error=max(v.grad_error for v in verdicts),
        param_error=max(v.param_error for v in verdicts),
        worst=max(v.worst for v in verdicts),
    )


def _evaluate(result, run, world):
    """The case's evaluation on every rank, against the oracle over all ranks' evaluation batches and
    against the unpatched release; into `result` (its worst error included)."""

    import unsloth_diffusion_norm

    from . import experiment, judging

    trainer = run.trainer
    result.eval_loss, evaluated = experiment.evaluate(trainer, EVAL_SEED)
    _judge_evaluation(result, run, world, evaluated, judging.expected_evaluation_loss)
    with unsloth_diffusion_norm.unpatched():
        result.eval_unpatched, _ = experiment.evaluate(trainer, EVAL_SEED)


def _judge_evaluation(result, run, world, batches, expected_loss):
    """result.eval_reference: `expected_loss(model, every rank's batches)` at the trained weights; the
    evaluation's error joins result.worst."""
    import torch.distributed as dist

    from . import oracle

    everyone = [None] * world
    dist.all_gather_object(everyone, batches)
    model = run.reference_model
    model.load_state_dict(run.trainer.model.state_dict())
    result.eval_reference = expected_loss(model, [batch for rank in everyone for batch in rank])
    error = abs(result.eval_loss - result.eval_reference) / oracle.tolerance(result.eval_reference)
    result.worst = max(result.worst, error)


def _judge_draw_spread(result, case, run, world, rank):
    """Two keyed draws per example: the spread between the draws' eval losses, the masked-token accuracy and the
    masked CE by noise level, over every rank's batches, against the oracle's; their errors join result.worst."""
    import torch.distributed as dist

    from . import experiment, judging, oracle

    trainer, found = run.trainer, {}
    trainer.args.diffusion_eval_draws = 2
    try:
        _, seen = experiment.evaluate(trainer, seed=None, metrics=found)
    finally:
        trainer.args.diffusion_eval_draws = 1
    everyone = [None] * world
    dist.all_gather_object(everyone, judging.keyed_evaluation(seen, case.seed, draws=2, world_size=world, rank=rank))
    result.eval_spread = found["eval_loss_draw_std"]
    result.eval_spread_reference, _ = judging.expected_draw_spread(
        run.reference_model, [batch for batches in everyone for batch in batches]
    )
    error = abs(result.eval_spread - result.eval_spread_reference)
    result.worst = max(result.worst, error / oracle.tolerance(result.eval_spread_reference))
    keyed = [batch for batches in everyone for batch in batches]
    result.eval_scores_reference = judging.expected_evaluation_scores(run.reference_model, keyed)
    result.eval_scores = {name: found[name] for name in found if name in result.eval_scores_reference}
    result.worst = max(result.worst, judging.scores_error(found, result.eval_scores_reference))


def _fixed_evaluation(result, case, settings, run, world):
    """A keyed evaluation on every rank: twice on the same weights, against the oracle over all ranks' keyed
    batches, its examples' positions; and the training with and without evaluating, the field set and unset."""
    import torch.distributed as dist

    from . import experiment, judging

    trainer, rank = run.trainer, dist.get_rank()
    result.eval_loss, seen = experiment.evaluate(trainer, seed=None)
    result.eval_again, _ = experiment.evaluate(trainer, seed=None)
    eval_rows = [e.row()["input_ids"] for e in case.examples()]
    result.eval_positions_ok = all(
        batch["input_ids"][0].tolist() == eval_rows[m * world + rank] for m, (_, batch) in enumerate(seen)
    )
    keyed = judging.keyed_evaluation(seen, case.seed, world_size=world, rank=rank)
    _judge_evaluation(result, run, world, keyed, judging.expected_fixed_evaluation_loss)
    _judge_draw_spread(result, case, run, world, rank)
    trainer.args.diffusion_eval_noise = None  # the same weights, the release's own draws
    try:
        result.eval_unpatched, _ = experiment.evaluate(trainer, EVAL_SEED)
    finally:
        trainer.args.diffusion_eval_noise = case.eval_noise
    settings = {k: v for k, v in settings.items() if k not in ("before_train", "diffusion_eval_noise")}
    plain = experiment.train(case.examples(), **{**settings, "eval_strategy": "no"})  # (no evaluation: no field)
    result.eval_training_difference = experiment.divergence(run, plain)
    unset = experiment.train(case.examples(), **settings)  # evaluating at every step with the release's draws
    result.eval_training_difference_unset = experiment.final_difference(unset, plain)


class Notes:
    """What the plugin's logger says on this rank from now until detach()."""

    def __init__(self):
        import logging

        from ..registry import logger

        self.lines, self.logger = [], logger
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.lines.append(record.getMessage())
        logger.addHandler(self.handler)

    def detach(self):
        self.logger.removeHandler(self.handler)


def worker(names, out, engine_name=None, drawn=None):
    """Inside a launched process: run the named cases (of `drawn` too, a JSON file of cases by name: the fuzzer's),
    gather every rank's results, rank 0 writes them."""
    import contextlib
    import io

    import torch.distributed as dist

    fixtures.import_unsloth()
    engine = engines.ENGINES[engine_name] if engine_name else None
    cases = dict(SHARDED if engine else CASES)
    if drawn is not None:
        with open(drawn) as f:
            cases.update({name: Case.from_json(values) for name, values in json.load(f).items()})
    if engine is not None:
        engines.prepare(engine)
    results = []
    for name in names:
        with contextlib.redirect_stdout(io.StringIO()):
            mine = run_case(name, cases[name], engine)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, asdict(mine))
        results.extend(everyone)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


LAUNCHERS = ("torchrun", "accelerate")


def launch(ranks, names, launcher="torchrun", timeout=600, engine=None, nodes=1, drawn=None):
    """Start `ranks` real processes the way users do and return every rank's result of every case
    (under an engines.ENGINES engine, launched as that engine says, or plain DDP). `nodes` > 1: as many
    torchrun agents on 127.0.0.1, one per node (static rendezvous), each with ranks / nodes processes, so
    LOCAL_RANK differs from RANK as on a multi-node job. `drawn`: more cases by name (the fuzzer's, dp_cases.Case),
    run first (before a case that rewrites Trainer for good). The launchers and every rank are stopped and
    reaped when it returns, fails, times out or is interrupted."""
    scratch = tempfile.mkdtemp(prefix="udn-ddp-")
    try:
        out = os.path.join(scratch, "results.json")
        module = ["-m", __name__, "--worker", "--json", out, "--cases", *(drawn or {}), *names]
        if drawn:
            with open(os.path.join(scratch, "drawn.json"), "w") as f:
                json.dump({name: case.to_json() for name, case in drawn.items()}, f)
            module += ["--drawn", os.path.join(scratch, "drawn.json")]
        # Unsloth writes its compile cache into the working directory: keep it out of the user's.
        cwd = os.path.join(scratch, "cwd")
        os.mkdir(cwd)
        if engine is not None:
            module += ["--engine", engine.name]
            commands = [engines.command(engine, ranks, cwd)]
            what = f"{engine.launcher} with {ranks} ranks ({engine.name})"
        elif nodes > 1:
            if launcher != "torchrun" or ranks % nodes:
                raise ValueError(f"a {nodes}-node layout takes torchrun and a multiple of {nodes} ranks")
            commands = node_agents(nodes, ranks // nodes)
            what = f"{nodes} torchrun agents (nodes) with {ranks // nodes} ranks each"
        else:
            commands, what = [one_node(launcher, ranks)], f"{launcher} with {ranks} ranks"
        env = {
            **os.environ,
            **fixtures.CPU_ENVIRONMENT,
            "OMP_NUM_THREADS": "1",  # several ranks share few cores
            "PYTHONWARNINGS": "ignore",
            **(engines.environment(engine) if engine is not None else {}),
        }
        try:
            done = processes.run_together([command + module for command in commands], timeout, env=env, cwd=cwd)
            if nodes > 1 and done.returncode != 0 and PORT_TAKEN in done.stdout + done.stderr:
                # The free port node_agents found was taken before the first agent listened on it (another
                # launch's rank, between the probe and the bind): once more on a fresh one.
                commands = node_agents(nodes, ranks // nodes)
                done = processes.run_together([command + module for command in commands], timeout, env=env, cwd=cwd)
        except TimeoutError as error:
            raise RuntimeError(f"{what} timed out: {error}") from None
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
        with open(out) as f:
            return json.load(f)
    finally:
        with processes.deferred_interrupts():  # checkpoints of the resume cases, the results file
            shutil.rmtree(scratch, ignore_errors=True)


def one_node(launcher, ranks):
    """The launcher command of a one-node launch, as users type it."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    if launcher == "accelerate":
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            f"--num_processes={ranks}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            "--main_process_port=0",
        ]
    raise ValueError(f"launcher must be one of {LAUNCHERS}, not {launcher!r}")


PORT_TAKEN = "EADDRINUSE"  # what torch's TCPStore prints where its port is in use


def node_agents(nodes, per_node):
    """The torchrun agent of each node of a multi-node job, all on this machine: static rendezvous at
    127.0.0.1 on a free port (the agents of a real job run this on their own hosts)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--node_rank={node}",
            f"--nproc_per_node={per_node}",
            "--rdzv_backend=static",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
        ]
        for node in range(nodes)
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--cases", nargs="+", required=True)
    parser.add_argument("--engine")
    parser.add_argument("--drawn")
    args = parser.parse_args(argv)
    worker(args.cases, args.json, args.engine, args.drawn)
    return 0


if __name__ == "__main__":
    sys.exit(main())

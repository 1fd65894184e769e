"""Data-parallel runs on real processes: the plugin, Unsloth's DiffusionTrainer and the tiny model,
launched with torchrun or `accelerate launch` (Gloo on CPU: the Trainer / accelerate code path that
NCCL takes on GPUs).

Every rank trains and records its windows (clean batches, RNG state, gradients, parameters). After
training the ranks exchange what they saw, and each rank judges its own gradients and parameters
against the oracle over all ranks' data with the same masks. One launch runs many cases, because a
launch (process start plus `import unsloth`) costs far more than a case.

    python -m unsloth_diffusion_norm.verify.data_parallel [--ranks 2 3] [--json FILE]   # launches, prints the table
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

from . import fixtures, tables
from ..registry import NATIVE
from .fixtures import LONG, SHORT, answers, unsupervised
from .instruments import CollectiveCounter

EVAL_SEED = 1234






@dataclass
class Case:
    ranks: int
    per_rank: list  # rank -> its examples, in order
    gradient_accumulation_steps: int = 2
    average_tokens_across_devices: bool = True
    # False: the per-micro-batch normalization (the unpatched release, or the 'microbatch' flag on a
    # natively fixed one), a control that must miss the oracle.
    patched: bool = True
    evaluate: bool = False
    # Unsloth's gradient-accumulation rewrite of transformers.Trainer (installed on GPU hosts at load
    # time). Irreversible in a process, so such cases run last in their launch.
    unsloth_ga_trainer: bool = False
    # Train with a checkpoint every `resume_at` steps, resume from the first one in a fresh trainer,
    # and compare the final parameters with the uninterrupted run's (then judge the resumed steps).
    resume_at: int = None
    diffusion_noise: str = None  # the per-run noise flag
    lora: str = None  # fixtures.load_model's LoRA variant
    seed: int = 3  # realized counts differ between micro-batches and between ranks

    def examples(self):
        """The global order: accelerate deals micro-batches round-robin (rank r gets r, r+W, ...)."""
        return [rank[i] for i in range(len(self.per_rank[0])) for rank in self.per_rank]


CASES = {
    "unequal-counts": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], evaluate=True),
    "unequal-counts-unpatched": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], patched=False),
    "rank-with-zero-masked-tokens": Case(2, [answers(LONG, 2), unsupervised(2)]),
    "all-ranks-empty": Case(2, [unsupervised(2), unsupervised(2)]),
    "rank-local-counts": Case(
        2, [answers(LONG, 2), answers(SHORT, 2, 14)], average_tokens_across_devices=False
    ),
    "ga3-partial-last-window": Case(
        2, [answers(LONG, 2) + answers(SHORT, 2, 14), answers(SHORT, 3, 16) + answers(LONG, 1, 19)],
        gradient_accumulation_steps=3,
    ),
    "unequal-counts-unsloth-ga-trainer": Case(
        2, [answers(LONG, 2), answers(SHORT, 2, 14)], unsloth_ga_trainer=True
    ),
    "resume-mid-epoch": Case(2, [answers(LONG, 8), answers(SHORT, 8, 14)], resume_at=2),
    "per-sample-noise": Case(2, [answers(LONG, 2), answers(SHORT, 2, 14)], diffusion_noise="per_sample"),
    "per-sample-resume": Case(
        2, [answers(LONG, 8), answers(SHORT, 8, 14)], resume_at=2, diffusion_noise="per_sample"
    ),
    "three-ranks": Case(3, [answers(LONG, 2), answers(SHORT, 2, 14), answers(LONG[:7], 2, 16)], evaluate=True),
    "three-ranks-rank-local": Case(
        3, [answers(LONG, 2), answers(SHORT, 2, 14), answers(LONG[:7], 2, 16)], average_tokens_across_devices=False
    ),
}







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
    resume_difference: float = None  # max |param| between the resumed and the uninterrupted run
    checkpoint: list = None  # the files of the checkpoint a run resumed from
    noise_levels: list = None  # window -> micro-batch -> p_mask of each row, on this rank
    sample_masks: dict = None  # per-sample noise: generator seed -> (own tokens, masked)
    engine: str = None  # sharded.ENGINES name; None: DDP
    engine_on: bool = None  # the engine really wraps and shards the model
    layout: str = None  # what it did, in words
    ok: bool = False


def run_case(name, case, engine=None):
    """Train one case on this rank (under a sharded.ENGINES engine, or DDP); every rank returns its own
    RankResult."""
    import torch.distributed as dist

    import unsloth_diffusion_norm

    from . import experiment, judging, oracle, sharded

    unsloth_diffusion_norm.apply()
    if case.unsloth_ga_trainer:
        import transformers
        from unsloth.models._utils import patch_gradient_accumulation_fix

        patch_gradient_accumulation_fix(transformers.Trainer)
        assert transformers.Trainer.get_batch_samples.__name__ == "_unsloth_get_batch_samples"
    counter = CollectiveCounter()
    train = experiment.train if case.patched else experiment.train_per_micro_batch
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
        settings.update(engine.training_args, gathered=sharded.gathered(engine), record_with=sharded.record_with(engine))
    if case.diffusion_noise is not None:
        settings["diffusion_noise"] = case.diffusion_noise
    elif case.resume_at and unsloth_diffusion_norm.status().mode == NATIVE:
        settings["diffusion_noise"] = "global"  # resume-exact draws are an opt-in on 2026.10.7+
    resume_difference = checkpoint = None
    try:
        if case.resume_at:
            # The launcher's working directory is shared by the ranks: the checkpoint goes there.
            workdir = os.path.join(os.getcwd(), name)
            runs = experiment.train_and_resume(case.examples(), case.resume_at, workdir, **settings)
            run, resume_difference = runs.resumed, runs.difference
            saved = os.path.join(workdir, "full", f"checkpoint-{case.resume_at}")
            checkpoint = sorted(os.path.relpath(os.path.join(d, f), saved) for d, _, fs in os.walk(saved) for f in fs)
        else:
            run = train(case.examples(), **settings)
    finally:
        counter.detach()
    trainer = run.trainer
    world, rank = dist.get_world_size(), dist.get_rank()
    assert world == case.ranks, f"{name}: launched with {world} ranks, the case needs {case.ranks}"

    seen = [None] * world
    dist.all_gather_object(seen, [(w.batches, w.rng_state) for w in run.windows])
    rank_local = not case.average_tokens_across_devices
    verdicts = [
        judging.judge(run, window, ranks=[r[i] for r in seen], rank_local=rank_local)
        for i, window in enumerate(run.windows)
    ]
    result = RankResult(
        case=name,
        rank=rank,
        ranks=world,
        counts=[
            [[int(m.masked.sum()) for m in judging.realized(*r[i])] for r in seen] for i in range(len(run.windows))
        ],
        noise_levels=[judging.noise_levels(*window) for window in seen[rank]],
        sample_masks=(
            {str(k): v for k, v in judging.masks_by_sample(seen[rank]).items()}
            if case.diffusion_noise == "per_sample" else None
        ),
        logged_loss=[w.logged_loss for w in run.windows],
        reference_loss=[v.reference_loss for v in verdicts],
        grad_error=max(v.grad_error for v in verdicts),
        param_error=max(v.param_error for v in verdicts),
        worst=max(v.worst for v in verdicts),
        collectives=counter.per_window,
        model_wrapped=type(trainer.model_wrapped).__name__,
        resume_difference=resume_difference,
        checkpoint=checkpoint,
    )
    if engine is not None:
        result.engine = engine.name
        result.engine_on, result.layout = sharded.layout(engine, trainer)
    if case.evaluate:
        result.eval_loss, evaluated = experiment.evaluate(trainer, EVAL_SEED)
        everyone = [None] * world
        dist.all_gather_object(everyone, evaluated)
        model = run.reference_model
        model.load_state_dict(trainer.model.state_dict())
        result.eval_reference = judging.expected_evaluation_loss(model, [s for r in everyone for s in r])
        result.worst = max(
            result.worst, abs(result.eval_loss - result.eval_reference) / oracle.tolerance(result.eval_reference)
        )
        with unsloth_diffusion_norm.unpatched():
            result.eval_unpatched, _ = experiment.evaluate(trainer, EVAL_SEED)
    result.ok = result.worst <= 1.0
    return result


def worker(names, out, engine_name=None):
    """Inside a launched process: run the named cases, gather every rank's results, rank 0 writes them."""
    import contextlib
    import io

    import torch.distributed as dist

    import unsloth_diffusion_norm  # noqa: F401 - before unsloth, as users do

    from . import sharded

    with contextlib.redirect_stdout(io.StringIO()):
        import unsloth  # noqa: F401

    engine = sharded.ENGINES[engine_name] if engine_name else None
    cases = sharded.CASES if engine else CASES
    if engine is not None:
        sharded.prepare(engine)
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


def launch(ranks, names, launcher="torchrun", timeout=600, engine=None):
    """Start `ranks` real processes the way users do and return every rank's result of every case
    (under a sharded.ENGINES engine, launched as that engine says, or plain DDP)."""
    from . import sharded

    out = tempfile.mkstemp(prefix="udn-ddp-", suffix=".json")[1]
    module = ["-m", "unsloth_diffusion_norm.verify.data_parallel", "--worker", "--json", out, "--cases", *names]
    # Unsloth writes its compile cache into the working directory: keep it out of the user's.
    cwd = tempfile.mkdtemp(prefix="udn-ddp-cwd-")
    if engine is not None:
        module += ["--engine", engine.name]
        command, launcher = sharded.command(engine, ranks, cwd), engine.launcher
    elif launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    elif launcher == "accelerate":
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={ranks}",
            "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no", "--main_process_port=0",
        ]
    else:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, not {launcher!r}")
    env = {
        **os.environ,
        **fixtures.CPU_ENVIRONMENT,
        "OMP_NUM_THREADS": "1",  # several ranks share few cores
        "PYTHONWARNINGS": "ignore",
        **(sharded.environment(engine) if engine is not None else {}),
    }
    done = subprocess.run(command + module, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{launcher} with {ranks} ranks{f' ({engine.name})' if engine else ''} failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
        )
    with open(out) as f:
        results = json.load(f)
    os.unlink(out)
    shutil.rmtree(cwd, ignore_errors=True)  # checkpoints of the resume cases
    return results


def render(results):
    """One row per case: counts per rank, loss vs reference, worst errors over ranks and windows."""
    by_case = {}
    for r in results:
        by_case.setdefault(r["case"], []).append(r)
    header = ["case", "ranks", "masked tokens per micro-batch, by rank (windows split by /)", "loss", "reference",
              "max grad error per rank", "max param error", "worst / tol", "count collectives per window",
              "within tolerance"]
    table = []
    for name, rows in by_case.items():
        rows.sort(key=lambda r: r["rank"])
        first = rows[0]
        counts = " / ".join(" ".join(f"r{k}:{c}" for k, c in enumerate(window)) for window in first["counts"])
        loss = " / ".join(f"{x:.6f}" for x in first["logged_loss"])
        reference = " / ".join(f"{x:.6f}" for x in first["reference_loss"])
        grads = " ".join(f"{r['grad_error']:.1e}" for r in rows)
        params = max(r["param_error"] for r in rows)
        worst = max(r["worst"] for r in rows)
        collectives = sorted({tuple(r["collectives"]) for r in rows})
        ok = all(r["ok"] for r in rows)
        table.append([name, first["ranks"], counts, loss, reference, grads, f"{params:.1e}", f"{worst:.3g}",
                      " ".join(map(str, collectives[0])) if len(collectives) == 1 else collectives,
                      "yes" if ok else "NO"])
    lines = tables.markdown(header, table)
    resumed = [r for r in results if r.get("resume_difference") is not None]
    if resumed:
        lines += ["", *tables.markdown(
            ["case", "rank", "max abs parameter difference, resumed vs uninterrupted run"],
            [[r["case"], r["rank"], f"{r['resume_difference']:.3g}"] for r in resumed])]
    evaluated = [r for r in results if r.get("eval_loss") is not None and r["rank"] == 0]
    if evaluated:
        lines += ["", *tables.markdown(
            ["case", "eval loss (rank 0)", "oracle", "unpatched release"],
            [[r["case"], f"{r['eval_loss']:.6f}", f"{r['eval_reference']:.6f}", f"{r['eval_unpatched']:.6f}"]
             for r in evaluated])]
    return "\n".join(lines)


def plan(ranks):
    """The cases of one launch; those that rewrite transformers.Trainer for good go last."""
    names = [name for name, case in CASES.items() if case.ranks == ranks]
    return sorted(names, key=lambda name: CASES[name].unsloth_ga_trainer)


# One launch per size; both launchers users reach for are exercised.
PLAN = {2: ("torchrun", plan(2)), 3: ("accelerate", plan(3))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=sorted(PLAN), help="launch sizes to run")
    parser.add_argument("--json", help="write every rank's results here")
    parser.add_argument("--cases", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.cases, args.json, args.engine)
        return 0
    results = []
    for ranks in args.ranks:
        launcher, names = PLAN[ranks]
        results += launch(ranks, names, launcher)
    from . import oracle
    from ..detect import unsloth_version

    command = {"torchrun": "torchrun", "accelerate": "accelerate launch"}
    launched = ", ".join(f"{ranks} ranks with {command[PLAN[ranks][0]]}" for ranks in args.ranks)
    print(
        f"Unsloth {unsloth_version()}; {launched}; Gloo on CPU; "
        f"{oracle.describe_tolerance()}\n"
    )
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if succeeded(results) else 1


def succeeded(results):
    """Every patched case within tolerance on every rank; every unpatched control misses."""
    for r in results:
        if CASES[r["case"]].patched != r["ok"]:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())

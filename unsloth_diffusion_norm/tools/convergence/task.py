"""Part 3, does it change what a model can do: exact-match accuracy on a task the study's model learns in
minutes, per arm, over paired seeds.

The task: reverse a sequence of 1 to 16 symbols (ten words of the tiny model's vocabulary), given right-aligned
after filler words and closed by a separator, so answer token i always comes from the same prompt position and a
small model learns it within a few hundred steps. Why reversal: each answer has its own length (1 to 16 tokens and
its EOS), which per-micro-batch normalization reweights by; the answer is decided exactly (the sequence, in
reverse); copying the prompt, the obvious wrong answer, is right only for palindromes. Held-out sequences are
disjoint from training ones (a sequence's hash decides its side). Each batch is padded to a multiple of 8 with
maskable EOS tails, which the model needs to learn it at batch 1 (measured: no tails, nothing learned in 2,000
steps; tails, learned by ~500) and which leave the rows' maskable lengths unequal.

Decoding is the package's one decoder (`samples.decode`: greedy low-confidence remasking, at most 32 steps), at
the answer's true length. Every arm is the real DiffusionTrainer (`runs.train`) at global noise; a seed fixes the
initialization, the data order and every noise draw, shared by both arms of a seed."""

import contextlib
import dataclasses
import hashlib
import json
import os
import time

from .reversal import WIDTH, _words, answer, baselines, held_out, palindrome, prompt, rows, sequences
from .runs import MICROBATCH, WINDOW, Arm, Training, shape, train
from .seeds import COMPLEMENTARY, FLAGS, NAMES, STRATIFIED, TWICE, _label, interval

BINS = ((1, 4), (5, 8), (9, 12), (13, 16))  # answer lengths (symbols, the EOS aside)
# The arms, as Part 2 names them: the window and per-micro-batch normalization; the lower-variance noise arms
# (window-normalized): stratified levels, complementary mask pairs, and the window at twice the rows per step
# (the pairs' forward compute).
ARMS = (WINDOW, MICROBATCH, STRATIFIED, COMPLEMENTARY, TWICE)
# "Learned": the first measured step at this exact-match accuracy or above. Half: past the jump from near 0 % (a run
# that jumps reaches 80-100 % within 100 steps), below the 87-89 % plateau many runs stay on (the longest answers).
LEARNED = 0.5
# The first steps, whose losses a run of any length shares (constant schedule after warm-up, one data order):
# their fingerprint tells two arms apart without training the second to the end (the quick test).
EARLY = 10


@dataclasses.dataclass(frozen=True)
class Part3(Training):
    """Part 3's settings: the documented run; QUICK3 the test's, GPU3 the larger model on a CUDA device."""

    seeds: tuple = (0, 1, 2, 3, 4, 5, 6, 7)
    batch: int = 1
    ga: int = 8
    steps: int = 1200  # past the jump from near 0 to near 100 % (measured at 2 threads: 300 to 900 steps)
    train_rows: int = 4096
    held_rows: int = 256
    max_length: int = 40
    hidden: int = 64
    heads: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    pad_multiple: int = 8
    schedule: str = "constant"
    every: int = 50  # accuracy and the held-out objective measured every so many optimizer steps
    eval_draws: int = 2  # keyed draws per held-out row for the objective


QUICK3 = Part3(seeds=(0,), batch=4, ga=2, steps=700, train_rows=2048, held_rows=64, every=350)
# The larger model on a CUDA device, bf16 (the GPU preset's habit), measured less often: its seeds are added to a
# results file a chunk at a time (--add-to), each arm of a seed a unit of its own.
GPU3 = Part3(
    seeds=(), hidden=256, layers=4, heads=8, learning_rate=1e-3, every=100, held_rows=128, device="cuda", bf16=True
)


def _bin(length):
    return next(k for k, (low, high) in enumerate(BINS) if low <= length <= high)


class Accuracy:
    """runs.train's held_out: exact-match accuracy of the held-out items, decoded with the package's decoder,
    overall and by answer length, and apart from them the palindromes' (`apart`); beside it the held-out objective
    (Part 2's, under keyed draws that hold still). `block`: decoded block by block at that size (a block-diffusion
    run's model with the bidirectional attention of its weights, as its samples are), and with `canvas` also over
    the whole canvas (`canvas_accuracy`)."""

    def __init__(self, held, draws, apart=(), block=None, canvas=False):
        from .heldout import HeldOut

        self.held, self.apart, self.objective = held, list(apart), HeldOut(draws)
        self.block, self.canvas = block, canvas

    def bind(self, trainer):
        self.tokenizer = trainer.processing_class
        self.mask_id, _ = trainer.diffusion_profile._token_ids(trainer.model, trainer.args)
        self.objective.bind(trainer)  # (the trainer's eval set: the held-out items)
        return self

    def measure(self, model):
        hits, apart, tokens = self._decoded(model, self.block)
        every = [hit for part in hits for hit in part]
        found = {
            "accuracy": sum(every) / len(every),
            "by_length": [sum(p) / len(p) if p else None for p in hits],
            "palindromes": sum(apart) / len(apart) if apart else None,
        }
        if self.block is not None:  # (what was decoded, as a fingerprint: the two decodings told apart)
            found["decoded"] = _fingerprint(tokens)
        if self.block is not None and self.canvas:
            whole, _, tokens = self._decoded(model, None)
            found.update(canvas_accuracy=sum(h for part in whole for h in part) / len(every))
            found["canvas_decoded"] = _fingerprint(tokens)
        return {**found, "objective": self.objective.measure(model)["objective"]}

    def _decoded(self, model, block):
        """(hits by answer-length bin, the palindromes' hits, every decoded row) of the held-out items."""
        import torch

        from ... import block_attention, construction
        from ...samples import decode_rows

        was_training, hits, apart, groups, tokens = model.training, [[] for _ in BINS], [], {}, []
        for sequence in self.held + self.apart:  # (decoded together: the sequences of one length)
            wanted = self.tokenizer(" " + _words(answer(sequence)))["input_ids"] + [self.tokenizer.eos_token_id]
            given = self.tokenizer(prompt(sequence))["input_ids"]
            groups.setdefault((len(given), len(wanted)), []).append((sequence, given, wanted))
        model.eval()
        try:
            with torch.no_grad(), block_attention.bidirectional(model, construction.model_config(model)):
                for (_, length), group in sorted(groups.items()):
                    got = decode_rows(model, [given for _, given, _ in group], length, self.mask_id, block=block)
                    tokens += got
                    for (sequence, _, wanted), row in zip(group, got):
                        (apart if palindrome(sequence) else hits[_bin(len(sequence))]).append(row == wanted)
        finally:
            model.train(was_training)
        return hits, apart, tokens


def _fingerprint(rows):
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def checkpoint(where, settings, seed):
    """The tiny model's class at `seed`'s initialization, its word tokenizer, the study's shape."""
    from ...proof.tiny_model import write_tiny_checkpoint

    folder = os.path.join(where, f"task-model-{seed}")
    write_tiny_checkpoint(folder, seed=seed, **shape(settings))
    return folder


def digest(log):
    """A fingerprint of a run's training losses and gradient norms, exact to the bit (JSON writes floats as repr)."""
    steps = [(entry["loss"], entry.get("grad_norm")) for entry in log]
    return hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:16]


def train_arm(settings, seed, name, workdir):
    """One arm of one seed (`train_on_task`): {seed, seconds, measured, digest, early, loss}."""
    ga = settings.ga * (2 if name == TWICE else 1)
    normalization = MICROBATCH if name == MICROBATCH else WINDOW
    arm = Arm(_label(name), settings.batch, ga, normalization, seed=seed, flags=FLAGS.get(name))
    where = os.path.join(workdir, f"{name}-{seed}")
    return train_on_task(settings, arm, where, checkpoint(where, settings, seed))


def train_on_task(settings, arm, where, model, block=None, canvas=False):
    """`arm` trained on the task's rows from the checkpoint `model`, at one CPU thread whatever the machine (the
    learning jump moves with the thread count, so a run does not depend on the cores or the number of workers),
    its held-out items measured every `settings.every` steps (`Accuracy`, `block` and `canvas` its decodings):
    {seed, seconds, measured, digest, early, loss}."""
    import torch
    from datasets import Dataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_rows = Dataset.from_list(rows(sequences(1, settings.train_rows, held=False)))
        held, palindromes = held_out(2, settings.held_rows)
        train(
            arm,
            train_rows,
            Dataset.from_list(rows(held)),
            model,
            settings,
            where,
            noise=None,
            evaluate=False,
            record_params=False,
            held_out=Accuracy(held, settings.eval_draws, palindromes, block, canvas),
            every=settings.every,
        )
    finally:
        torch.set_num_threads(threads)
    return {
        "seed": arm.seed,
        "seconds": arm.seconds,
        "measured": arm.measured,
        "digest": digest(arm.log),
        "early": digest(arm.log[:EARLY]),
        "loss": arm.log[-1]["loss"],
    }


def _start_worker():
    """A worker process: the plugin, then Unsloth, as users import them (banners dropped)."""
    from ...proof import fixtures

    fixtures.import_unsloth()


@contextlib.contextmanager
def trainers(workers, function=None):
    """train(jobs): each job's run (`function(*job)`, by default `train_arm`), in the jobs' order as they finish;
    here with one worker, else in `workers` spawned processes that import the plugin, then Unsloth, as users do."""
    function = function or train_arm
    if workers <= 1:
        yield lambda jobs: (function(*job) for job in jobs)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)
    try:
        yield lambda jobs: pool.map(function, *zip(*jobs)) if jobs else iter(())
    finally:
        pool.shutdown(cancel_futures=True)


def part3(settings, workdir, say=print, arms=ARMS, workers=1):
    """{arm: [run per seed]}: every arm of every seed trained (`train_arm`) and measured; `workers` processes side
    by side (1: here, in this process)."""
    jobs = [(seed, name) for seed in settings.seeds for name in arms]
    found = {}
    with trainers(min(workers, len(jobs))) as train:
        for (seed, name), run in zip(jobs, train([(settings, seed, name, workdir) for seed, name in jobs])):
            found[(seed, name)] = run
            a = run["measured"][-1][1]
            say(
                f"seed {seed} {name}: accuracy {a['accuracy']:.3f}, objective {a['objective']:.4f} ({run['seconds']} s)"
            )
    return {name: [found[(seed, name)] for seed in settings.seeds] for name in arms}


def steps_to_learn(run):
    """The first measured step at LEARNED accuracy or above; None if the run never got there."""
    return next((step for step, found in run["measured"] if found["accuracy"] >= LEARNED), None)


def _stats(values):
    return dict(zip(("mean", "low", "high", "sd"), interval(values)))


def _mean(values):
    """The mean of the values measured (None: a bin no held-out sequence fell in)."""
    found = [v for v in values if v is not None]
    return interval(found)[0] if found else None


def _final(run, metric):
    return run["measured"][-1][1][metric]


def _paired(ours, theirs):
    """ours − theirs over paired seeds: final accuracy, final objective, and the steps to learn (over the seeds
    where both learned)."""
    out = {
        metric: _stats([_final(a, metric) - _final(b, metric) for a, b in zip(ours, theirs)])
        for metric in ("accuracy", "objective")
    }
    both = [(steps_to_learn(a), steps_to_learn(b)) for a, b in zip(ours, theirs)]
    both = [(a, b) for a, b in both if a is not None and b is not None]
    if both:
        out["steps"] = {**_stats([a - b for a, b in both]), "seeds": len(both)}
    return out


def complete(runs):
    """{arm: [run per seed]} over the seeds every arm has run (chunks may leave a seed part-trained), in seed order."""
    by = {name: {run["seed"]: run for run in arm_runs} for name, arm_runs in runs.items()}
    seeds = sorted(set.intersection(*(set(found) for found in by.values()))) if by else []
    return {name: [by[name][seed] for seed in seeds] for name in runs}, seeds


def report(runs, settings, native=None):
    """The JSON: per arm the final accuracy (mean, 95 % interval, seed spread; by length), the held-out objective,
    the steps it took to learn the task, the curves of means; the paired differences of every arm against the
    window (and of the window at twice the rows against the pairs: equal forward compute); Unsloth's own fix
    against the window arm, seed by seed (`native`: a Part 3 JSON run on 2026.10.7+); the baselines; every run."""
    found, seeds = complete(runs)
    held, palindromes = held_out(2, settings.held_rows)
    arms = {}
    for name, arm_runs in found.items():
        if not arm_runs:
            continue
        arms[name] = {
            "label": _label(name),
            "accuracy": _stats([_final(r, "accuracy") for r in arm_runs]),
            "objective": _stats([_final(r, "objective") for r in arm_runs]),
            "per_seed": [_final(r, "accuracy") for r in arm_runs],
            "by_length": [_mean([_final(r, "by_length")[k] for r in arm_runs]) for k in range(len(BINS))],
            "curve": [
                (step, interval([r["measured"][i][1]["accuracy"] for r in arm_runs])[0])
                for i, (step, _) in enumerate(arm_runs[0]["measured"])
            ],
            "objective_curve": [
                (step, interval([r["measured"][i][1]["objective"] for r in arm_runs])[0])
                for i, (step, _) in enumerate(arm_runs[0]["measured"])
            ],
            "steps_to_learn": [steps_to_learn(r) for r in arm_runs],
            "seconds": round(sum(r["seconds"] for r in arm_runs), 1),
        }
    paired = {}  # (each difference named by its sign: "a_minus_b" is a − b, seed by seed)
    pairs = [(WINDOW, name) for name in arms if name != WINDOW] if WINDOW in arms else []
    if COMPLEMENTARY in arms and TWICE in arms:
        pairs.append((TWICE, COMPLEMENTARY))  # equal forward compute
    for ours, theirs in pairs:
        paired[f"{ours}_minus_{theirs}"] = _paired(found[ours], found[theirs])
    return {
        "settings": dataclasses.asdict(settings),
        "seeds": seeds,
        "arms": arms,
        "paired": paired,
        "native": native_check(native, runs) if native is not None else None,
        "baselines": baselines(held),
        "palindromes": len(palindromes),
        "bins": [f"{low}-{high}" for low, high in BINS],
        "runs": runs,
    }


def native_check(native, runs):
    """Unsloth's own fix (the window arm of a Part 3 run on 2026.10.7+) against this run's window arm, per seed both
    ran: the training losses bitwise (their digests) and every measurement."""
    ours = {run["seed"]: run for run in runs.get(WINDOW, [])}
    seeds = [run for run in native["part3"]["runs"][WINDOW] if run["seed"] in ours]
    return {
        "unsloth": native["unsloth"],
        "seeds": [run["seed"] for run in seeds],
        "equal_losses": all(run["digest"] == ours[run["seed"]]["digest"] for run in seeds),
        "equal_measurements": all(
            json.loads(json.dumps(run["measured"])) == json.loads(json.dumps(ours[run["seed"]]["measured"]))
            for run in seeds
        ),
    }


def settings_differ(theirs, settings):
    """The names of the settings a results file's Part 3 (`theirs`, its JSON) ran at other than `settings`, the
    seeds aside (a file may hold fewer or more)."""
    ours = json.loads(json.dumps(dataclasses.asdict(settings)))
    return sorted(name for name in ours if name != "seeds" and theirs.get(name) != ours[name])


def check_native(native, settings):
    """Refuses a --native file unless its Part 3 ran at these settings (its seeds may be fewer)."""
    from ..console import Failure

    differ = settings_differ(native["part3"]["settings"], settings)
    if differ:
        raise Failure(f"--native: that run's Part 3 settings differ from this run's in {', '.join(differ)}")


def grow(path, settings, workdir, minutes, say=print, arms=ARMS, device=None):
    """A chunk of a study that grows: train the next (seed, arm) runs the results file at `path` lacks, seeds in
    order, one at least, until the next would pass `minutes` (judged by the longest run so far); write it after each
    run (a chunk cut short keeps what it finished). The file's report counts the seeds every arm has run; its
    `chunks` say where, when and how much each chunk added. Returns the file's JSON."""
    from ..console import Failure, write_json

    found = None
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        if settings_differ(found.get("part3", {}).get("settings", {}), settings):
            raise Failure(f"--add-to: {path} holds a Part 3 run at other settings; give another file")
    runs = found["part3"]["runs"] if found else {}
    runs = {name: runs.get(name, []) for name in arms}
    chunks = found.get("chunks", []) if found else []
    chunk = {"device": device or "cpu", "date": time.strftime("%Y-%m-%d", time.gmtime()), "runs": 0, "seconds": 0}
    chunks.append(chunk)
    started, longest = time.time(), max((r["seconds"] for arm_runs in runs.values() for r in arm_runs), default=0)
    seed = 0
    while True:
        todo = [name for name in arms if seed not in {r["seed"] for r in runs[name]}]
        if not todo:
            seed += 1
            continue
        if chunk["runs"] and time.time() - started + longest > 60 * minutes:  # (a chunk adds one run at least)
            break
        run = train_arm(settings, seed, todo[0], workdir)
        runs[todo[0]].append(run)
        longest = max(longest, run["seconds"])
        chunk["runs"] += 1
        chunk["seconds"] = round(time.time() - started, 1)
        found = {"part3": report(runs, settings), "chunks": chunks}
        write_json(found, path)
        say(f"seed {seed} {todo[0]}: accuracy {_final(run, 'accuracy'):.3f} ({run['seconds']} s); written to {path}")
    return found or {"part3": report(runs, settings), "chunks": chunks}


def minus(name):
    """The two arms of a paired difference's name, "a_minus_b": (a, b), the difference being a − b. (A file
    written before the names said so: "equal_compute" is the window at twice the rows − the pairs, an arm's
    name the window − it.)"""
    if name == "equal_compute":
        return TWICE, COMPLEMENTARY
    return tuple(name.split("_minus_")) if "_minus_" in name else (WINDOW, name)


def render(part):
    def pct(value):
        return "–" if value is None else f"{100 * value:.1f} %"

    def band(d, scale=100, unit=" points", digits=1):
        if d["low"] is None:
            return "–"
        return f"{scale * d['low']:+.{digits}f} to {scale * d['high']:+.{digits}f}{unit}"

    lines = [
        "| arm | accuracy (mean) | 95 % interval | seed spread (sd) | "
        + " | ".join(f"length {b}" for b in part["bins"])
        + " | held-out objective |",
        "|---|---|---|---|" + "---|" * len(part["bins"]) + "---|",
    ]
    for arm in part["arms"].values():
        a, o = arm["accuracy"], arm["objective"]  # (Student's t over bimodal seeds can pass 100 %: shown as it is)
        interval_text = "–" if a["low"] is None else f"{pct(a['low'])} – {pct(a['high'])}"
        lines.append(
            f"| {arm['label']} | {pct(a['mean'])} | {interval_text} | {pct(a['sd'])} | "
            + " | ".join(pct(v) for v in arm["by_length"])
            + f" | {o['mean']:.4f} |"
        )
    lines += ["", f"| arm | steps to {100 * LEARNED:.0f} % exact match, per seed |", "|---|---|"]
    for arm in part["arms"].values():
        lines.append(
            f"| {arm['label']} | " + ", ".join("never" if s is None else str(s) for s in arm["steps_to_learn"]) + " |"
        )
    lines.append("")
    for name, d in part["paired"].items():
        ours, theirs = minus(name)
        who = " − ".join("window" if arm == WINDOW else NAMES[arm] for arm in (ours, theirs))
        who += " (equal forward compute)" if ours == TWICE else ""
        lines.append(
            f"{who}: final accuracy {100 * d['accuracy']['mean']:+.1f} points (95 % interval {band(d['accuracy'])}); "
            f"held-out objective {d['objective']['mean']:+.4f} ({band(d['objective'], 1, '', 4)})"
            + (
                f"; steps to learn {d['steps']['mean']:+.0f} ({band(d['steps'], 1, '', 0)}; "
                f"{d['steps']['seeds']} seeds where both learned)"
                if "steps" in d
                else ""
            )
        )
    if part.get("native"):
        n = part["native"]
        same = n["equal_losses"] and n["equal_measurements"]
        lines.append(
            f"Unsloth's own fix ({n['unsloth']}), window arm, seed {', '.join(map(str, n['seeds']))}: "
            + ("bitwise the plugin's run (every loss and gradient norm, every measurement)" if same else "DIFFERS")
        )
    first = next(iter(part["arms"].values()))
    curve_steps = [step for step, _ in first["curve"]][:: max(1, len(first["curve"]) // 10)]
    lines += ["", "| arm | " + " | ".join(f"step {s}" for s in curve_steps) + " |", "|---|" + "---|" * len(curve_steps)]
    for arm in part["arms"].values():
        by_step = dict(arm["curve"])
        lines.append(f"| {arm['label']} | " + " | ".join(pct(by_step[s]) for s in curve_steps) + " |")
    lines.append("\nbaselines: " + ", ".join(f"{name} {pct(v)}" for name, v in part["baselines"].items()))
    return "\n".join(lines)


def describe(settings):
    return (
        f"Part 3: reversal of 1-{WIDTH} symbols, exact match on {settings.held_rows} held-out sequences; "
        f"{len(settings.seeds)} seeds, batch {settings.batch} x GA {settings.ga}, {settings.steps} steps, "
        f"hidden {settings.hidden}, {settings.schedule} learning rate {settings.learning_rate}"
    )


def draw(part, axes):
    """Three panels: final accuracy by answer length per arm, each arm's learning curve and its held-out objective
    (means over seeds)."""
    by_length, curves, objective = axes
    width = 0.8 / len(part["arms"])
    for k, arm in enumerate(part["arms"].values()):
        places = [i + (k - (len(part["arms"]) - 1) / 2) * width for i in range(len(part["bins"]))]
        by_length.bar(places, [100 * (v or 0) for v in arm["by_length"]], width, label=arm["label"])
        curves.plot([s for s, _ in arm["curve"]], [100 * v for _, v in arm["curve"]], label=arm["label"])
        objective.plot(
            [s for s, _ in arm["objective_curve"]], [v for _, v in arm["objective_curve"]], label=arm["label"]
        )
    by_length.set_xticks(range(len(part["bins"])), [f"{b} symbols" for b in part["bins"]])
    by_length.set_ylabel("exact match, held-out (%)")
    by_length.set_title(f"final accuracy by answer length ({len(part['seeds'])} seeds)")

    for value in part["baselines"].values():  # (the trivial answers' accuracy)
        by_length.axhline(100 * value, ls=":", lw=0.8, color="grey")
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("exact match (%)")
    curves.set_title("learning curve (mean over seeds)")
    curves.legend(fontsize=7, loc="lower right")
    objective.set_xlabel("optimizer step")
    objective.set_ylabel("held-out objective (nats)")
    objective.set_yscale("log")
    objective.set_title("held-out objective (mean over seeds)")

"""Does NVIDIA's training mode change what the model learns? Block-diffusion training (`diffusion_paradigm=
"block_diff"`, the AR term at alpha 0.3) against bidirectional training of the same checkpoint, on Part 3's
reversal task (`task`), paired seeds, each run's held-out items decoded block by block (as NVIDIA's model
generates) and over the whole canvas.

A unit of work is one arm of one seed (`train_arm`, the real DiffusionTrainer at one CPU thread); the answers of the
task (2 to 17 tokens with their EOS) span one to five blocks of BLOCK tokens."""

import dataclasses
import os

from . import task
from .runs import WINDOW, Arm, shape

BLOCK = 4  # tokens per block: most of the task's answers span several
ALPHA = 0.3  # the AR term's weight: NVIDIA's recipe's and the flag's default
BIDIRECTIONAL, BLOCK_DIFF = "bidirectional", "block_diff"
ARMS = (BIDIRECTIONAL, BLOCK_DIFF)
FLAGS = {BLOCK_DIFF: {"diffusion_paradigm": BLOCK_DIFF, "diffusion_ar_loss_alpha": ALPHA}}


@dataclasses.dataclass(frozen=True)
class Settings(task.Part3):
    """Part 3's task and model at batch 4 x GA 2, the checkpoint's block size BLOCK."""

    batch: int = 4
    ga: int = 2
    block_size: int = BLOCK


def checkpoint(where, settings, seed):
    """The tiny model's class at `seed`'s initialization, bidirectional as NVIDIA ships it, its block size set."""
    from ...proof.tiny_model import write_tiny_checkpoint

    folder = os.path.join(where, f"block-model-{seed}")
    write_tiny_checkpoint(folder, seed=seed, block_size=settings.block_size, **shape(settings))
    return folder


def train_arm(settings, seed, name, workdir):
    """One arm of one seed (`task.train_on_task`), its held-out items decoded block by block (`accuracy`) and over
    the whole canvas (`canvas_accuracy`): {seed, seconds, measured, digest, early, loss, terms}."""
    arm = Arm(name, settings.batch, settings.ga, WINDOW, seed=seed, flags=FLAGS.get(name))
    where = os.path.join(workdir, f"{name}-{seed}")
    run = task.train_on_task(settings, arm, where, checkpoint(where, settings, seed), settings.block_size, True)
    return {**run, "terms": [(entry.get("loss_diffusion"), entry.get("loss_ar")) for entry in arm.log[-1:]]}


# ---- the registered study ----------------------------------------------------------------------------------------

SEEDS = 24  # per arm: the sign test's power at n = 24 is registered.power's
FIRST = 1000  # fresh seed numbers, none used by another study or the pilot (900, 901)
LEVEL = 0.05  # two-sided, the one primary test
SETTINGS = Settings(seeds=tuple(range(FIRST, FIRST + SEEDS)))
# The quick form (a test in make test): one seed, a few steps, the checks `check` makes.
QUICK = Settings(seeds=(FIRST,), steps=60, every=30, train_rows=512, held_rows=32)


def replication(settings, first):
    """The study again on SEEDS fresh seeds from `first` on."""
    return dataclasses.replace(settings, seeds=tuple(range(first, first + SEEDS)))


def fresh(first):
    """None where the seeds from `first` overlap none of the study's or the pilot's, else why not."""
    taken = set(SETTINGS.seeds) | {900, 901}
    if taken & set(range(first, first + SEEDS)):
        return f"seeds {first}-{first + SEEDS - 1} meet the registered seeds {FIRST}-{FIRST + SEEDS - 1} or the pilot's"
    return None


def grow(path, settings, workdir, minutes, say=print, workers=1, device="CPU", commit=None):
    """A chunk: the next whole seeds (both arms) the results file at `path` lacks, one at least, until the next
    would pass `minutes` (judged by the longest seed so far); written after each seed. Returns the file's JSON."""
    import json
    import time

    from ..console import Failure, write_json

    ours = json.loads(json.dumps(dataclasses.asdict(settings)))
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        if found.get("settings") != ours:
            raise Failure(f"--add-to: {path} holds the study at other settings; give another file")
    else:
        found = {"study": "block-diffusion", "settings": ours, "runs": {arm: [] for arm in ARMS}, "chunks": []}
    chunk = {"device": device, "commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "seeds": []}
    found["chunks"].append(chunk)
    started, longest = time.time(), max((c.get("longest", 0) for c in found["chunks"]), default=0)
    with task.trainers(workers, train_arm) as train:
        while len(complete(found)) < SEEDS:
            if chunk["seeds"] and time.time() - started + longest > 60 * minutes:
                break
            seed = next(s for s in settings.seeds if s not in complete(found))
            began = time.time()
            todo = [arm for arm in ARMS if seed not in {run["seed"] for run in found["runs"][arm]}]
            for arm, run in zip(todo, train([(settings, seed, arm, workdir) for arm in todo])):
                found["runs"][arm].append(run)
            longest = max(longest, time.time() - began)
            chunk.update(seeds=chunk["seeds"] + [seed], seconds=round(time.time() - started, 1))
            chunk["longest"] = round(longest, 1)
            write_json(found, path)
            say(f"seed {seed}: " + ", ".join(f"{arm} {_learned_text(found['runs'][arm][-1])}" for arm in todo))
    if not chunk["seeds"]:
        found["chunks"].pop()
    return found


def complete(found):
    """The seeds both arms have run, in order."""
    return sorted(set.intersection(*({run["seed"] for run in found["runs"][arm]} for arm in ARMS)))


def steps_to_learn(run, key="accuracy"):
    """The first measured step at `task.LEARNED` exact match under a decoding (`accuracy`: block by block,
    `canvas_accuracy`: the whole canvas); None if never."""
    return next((step for step, found in run["measured"] if found[key] >= task.LEARNED), None)


def _learned_text(run):
    steps = steps_to_learn(run)
    return "never" if steps is None else str(steps)


DECODINGS = {"block": "accuracy", "canvas": "canvas_accuracy"}


def analysis(found):
    """The primary test (block-by-block decoding: steps to 50 %, censored, the exact sign test, block_diff against
    bidirectional) and the same under whole-canvas decoding, the final exact match, the seeds that learned and the
    area under the curve (secondary); the step time ratio. Tests only at the registered seed count."""
    from . import registered

    settings, seeds = found["settings"], complete(found)
    done = len(seeds) >= SEEDS
    seeds = seeds[:SEEDS]
    by = {arm: {run["seed"]: run for run in found["runs"][arm]} for arm in ARMS}
    ours, theirs = ([by[arm][s] for s in seeds] for arm in (BLOCK_DIFF, BIDIRECTIONAL))
    out = {"seeds": len(seeds), "registered": done, "first_seed": (settings["seeds"] or [0])[0], "decodings": {}}
    if not seeds:
        return out
    late = settings["steps"] + settings["every"]  # censored: later than every run that learned
    for decoding, key in DECODINGS.items():
        a = [steps_to_learn(r, key) or late for r in ours]
        b = [steps_to_learn(r, key) or late for r in theirs]
        earlier, later, ties, p = registered.sign_test(a, b)
        median, (low, high) = registered.median_interval([x - y for x, y in zip(a, b)])
        learned = [[steps_to_learn(r, key) is not None for r in rows] for rows in (ours, theirs)]
        final = [x["measured"][-1][1][key] - y["measured"][-1][1][key] for x, y in zip(ours, theirs)]
        out["decodings"][decoding] = {
            "steps": {BLOCK_DIFF: a, BIDIRECTIONAL: b},
            "test": {"earlier": earlier, "later": later, "ties": ties, "p": p},
            "median_difference": {"mean": median, "low": low, "high": high},
            "final": registered._difference(final),
            "learned": dict(
                zip((BLOCK_DIFF, BIDIRECTIONAL, "p"), (*map(sum, learned), registered.mcnemar(*learned)[2]))
            ),
        }
    out["decodings"]["block"]["test"]["significant"] = done and out["decodings"]["block"]["test"]["p"] < LEVEL
    out["area"] = registered._difference([registered.area(x) - registered.area(y) for x, y in zip(ours, theirs)])
    out["seconds_ratio"] = sum(r["seconds"] for r in ours) / sum(r["seconds"] for r in theirs)
    return out


def verdict(result):
    """The registered answer in plain words, whichever way it falls."""
    test = result["decodings"]["block"]["test"]
    if test["significant"]:
        sooner = "sooner" if test["earlier"] > test["later"] else "later"
        return (
            f"Decoded block by block, the model trained in NVIDIA's block-diffusion mode learns the task {sooner} "
            "than the one trained bidirectionally."
        )
    return (
        f"Decoded block by block, {SEEDS} seeds find no difference in when the model learns the task between the "
        f"two modes: block diffusion first in {test['earlier']}, later in {test['later']}, tied in {test['ties']}."
    )


def render(found):
    """The registered table (or progress, with no test, below the registered seed count)."""
    from ...proof import tables
    from .registered import band

    result = analysis(found)
    seeds, done, first = result["seeds"], result["registered"], result["first_seed"]

    header = [
        "decoded",
        "block diffusion first / later / tied",
        "median difference, steps [95 %]",
        "sign test p",
        "final exact match, points [95 %]",
        "seeds that learned (block diffusion / bidirectional)",
    ]
    body = []
    for decoding, label in (("block", "block by block (primary)"), ("canvas", "whole canvas (secondary)")):
        d = result["decodings"].get(decoding)
        if d is None:
            continue
        t = d["test"]
        body.append(
            [
                label,
                f"{t['earlier']} / {t['later']} / {t['ties']}",
                band(d["median_difference"], 1, 0),
                f"{t['p']:.3g}" if done else "(at the registered seeds only)",
                band(d["final"]),
                f"{d['learned'][BLOCK_DIFF]} / {d['learned'][BIDIRECTIONAL]} (p {d['learned']['p']:.3g})",
            ]
        )
    study = "Replication" if first != FIRST else "Block-diffusion study"
    seeds_named = f"seeds {first}–{first + SEEDS - 1}"
    title = (
        f"{study} ({seeds_named}): {seeds} seeds of each mode (block diffusion − bidirectional)"
        if done
        else f"{study} ({seeds_named}), progress: {seeds} of {SEEDS} seeds (no test until all have run)"
    )
    lines = [title, ""] + tables.markdown(header, body)
    if "area" in result:
        lines += [
            "",
            f"Area under the block-decoded curve, points: {band(result['area'])}; step time, block "
            f"diffusion / bidirectional: {result['seconds_ratio']:.2f}.",
        ]
    if done:
        lines += ["", verdict(result)]
    return "\n".join(lines)


def plan():
    """The registered design as the page states it, with the sign test's power."""
    from . import registered

    shares = (0.7, 0.75, 0.8, 0.875)
    return "\n".join(
        [
            f"arms: {', '.join(ARMS)} (block {BLOCK}, alpha {ALPHA}); batch {SETTINGS.batch} x GA {SETTINGS.ga}",
            f"seeds: {FIRST}-{FIRST + SEEDS - 1} per arm; {SETTINGS.steps} steps, measured every {SETTINGS.every}; "
            f"held-out: {SETTINGS.held_rows} distinct non-palindromic items, decoded block by block and whole",
            f"test: exact two-sided sign test at {LEVEL} (block-by-block decoding)",
            f"power at n = {SEEDS} decided seeds, by the share of seeds where one mode learns first: "
            + ", ".join(f"{share}: {registered.power(SEEDS, share):.2f}" for share in shares),
        ]
    )


def check(runs):
    """The quick form's checks: a line for each that fails (none: all hold). The block-diffusion arm trains both
    terms (its logged loss alpha · diffusion + AR, the AR term above 0) and the bidirectional arm neither; at the
    random initialization each run's held-out answers decoded block by block are not the whole canvas's."""
    wrong = []
    ((block_run,), (plain_run,)) = runs[BLOCK_DIFF], runs[BIDIRECTIONAL]
    ((diffusion, ar),) = block_run["terms"]
    loss = block_run["loss"]
    if diffusion is None or ar is None or not ar > 0 or abs(loss - (ALPHA * diffusion + ar)) > 2e-3 * max(1, loss):
        wrong.append(f"block_diff: the loss {loss} is not {ALPHA} · {diffusion} + {ar} (an AR term dropped?)")
    if plain_run["terms"] != [(None, None)]:
        wrong.append(f"bidirectional: logged block diffusion's terms {plain_run['terms']}")
    for arm, (run,) in runs.items():  # at the random initialization, where the order of decoding shows
        first = run["measured"][0][1]
        if first["decoded"] == first["canvas_decoded"]:
            wrong.append(f"{arm}: decoded block by block, the held-out answers are the whole canvas's")
    return wrong

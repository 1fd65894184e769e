"""The gradient variance of each noise arm, measured: python scripts/noise_variance.py [--keys K] [--json FILE]

One optimizer step's examples (n = 8: batch 1, GA 8), held fixed; only the noise varies, over K keys (the seed
of every per-sample key). For each arm, each key's window gradient: the window objective the plugin trains,
sum of CE/p_mask over the window's masked tokens divided by their count, through the plugin's own noise
functions (per_sample, noise) and the model's real forward and backward. Reported: the spread of the window
loss and of the gradient over keys (the trace of its covariance: E|g - mean g|^2), and each as a ratio to the
plain sampler at equal examples (one forward per example) and to two independent plain draws per example at
equal forward compute (the pair's cost).

Two settings: the tiny checkpoint with answers of 12 tokens, and the docstring data set (built here, nothing
downloaded) with a random-initialized model of the tiny model's class at its tokenizer's vocabulary (hidden 64,
2 layers, rows up to 64 tokens: the convergence study's Part 1 model). fp32 on CPU; about a minute on 2 cores.
"""

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")  # CPU-only host: needed by `import unsloth`
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import unsloth_diffusion_norm  # noqa: E402, F401 - the plugin first, as users do
from unsloth_diffusion_norm.proof import fixtures  # noqa: E402

fixtures.import_unsloth()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from unsloth_diffusion_norm import noise, per_sample  # noqa: E402
from unsloth_diffusion_norm.proof.judging import EPS, MASK_ID  # noqa: E402

N = 8  # examples per optimizer step
# arm -> (strata, pairs, independent draws per example)
ARMS = {
    "plain": (False, False, 1),
    "stratified": (True, False, 1),
    "complementary": (False, True, 1),
    "stratified + complementary": (True, True, 1),
    "plain, 2 independent draws": (False, False, 2),
}
FORWARDS = {arm: 2 if pairs or draws == 2 else 1 for arm, (_, pairs, draws) in ARMS.items()}


def rows_of(example_tokens, maskables, key_seed, arm):
    """The noise of the window's examples under `arm`, one Noise per example (its rows: 1, or 2 for a pair or
    two draws), from keys seeded by `key_seed` (draw d of an example: epoch d of its key)."""
    strata_on, pairs, draws = ARMS[arm]
    strata = per_sample.window_strata(key_seed, 0, 0, N) if strata_on else None
    found = []
    for k, (tokens, maskable) in enumerate(zip(example_tokens, maskables)):
        parts = []
        for d in range(draws):
            t, u = per_sample.uniforms([per_sample.sample_key(key_seed, d, k)], None, len(tokens), "cpu")
            if strata is not None:
                t = per_sample.stratified(t, [(strata[k], N)])
            p_mask = ((1 - EPS) * t + EPS)[:, None].expand(1, len(tokens))
            masked = (u < p_mask) & maskable
            drawn = noise.Noise(tokens[None], None, maskable[None], masked, p_mask)
            parts.append(noise.paired(drawn, EPS) if pairs else drawn)
        found.append(parts)
    return found


def window_gradient(model, example_tokens, maskables, key_seed, arm):
    """(window loss, flat gradient) of one key's draw under `arm`."""
    model.zero_grad(set_to_none=True)
    total, count = 0.0, 0
    for parts in rows_of(example_tokens, maskables, key_seed, arm):
        for drawn in parts:
            logits = model(input_ids=torch.where(drawn.masked, MASK_ID, drawn.input_ids)).logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), drawn.input_ids, reduction="none")
            total = total + (ce * drawn.masked / drawn.p_mask).sum()
            count += int(drawn.masked.sum())
    loss = total / max(count, 1)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()
    return float(loss.detach()), grad


def measure(model, example_tokens, maskables, keys):
    results = {}
    for arm in ARMS:
        losses, grads = [], []
        for key_seed in range(keys):
            loss, grad = window_gradient(model, example_tokens, maskables, key_seed, arm)
            losses.append(loss)
            grads.append(grad)
        grads = torch.stack(grads)
        deviations = ((grads - grads.mean(dim=0)) ** 2).sum(dim=1) * keys / (keys - 1)
        spread = deviations.mean().item()
        results[arm] = {
            "forwards per example": FORWARDS[arm],
            "loss variance": torch.tensor(losses, dtype=torch.float64).var().item(),
            "gradient variance": spread,
            "gradient variance standard error": deviations.std().item() / keys**0.5,
            "mean gradient norm": grads.mean(dim=0).norm().item(),
        }
    for arm, found in results.items():
        found["loss ratio, equal examples"] = found["loss variance"] / results["plain"]["loss variance"]
        found["gradient ratio, equal examples"] = found["gradient variance"] / results["plain"]["gradient variance"]
        baseline = results["plain" if FORWARDS[arm] == 1 else "plain, 2 independent draws"]
        found["gradient ratio, equal compute"] = found["gradient variance"] / baseline["gradient variance"]
    return results


def tiny_setting():
    model, _ = fixtures.load_model()
    examples = [fixtures.Example([10 + i, 11], fixtures.LONG) for i in range(N)]
    return "tiny checkpoint, 8 answers of 12 tokens + EOS", model, examples


def docstring_setting(where):
    from unsloth_diffusion_norm.tools import docstring_data
    from unsloth_diffusion_norm.tools.convergence import runs

    settings = runs.Training()
    train, _, tokenizer_folder = runs.split(where, settings)
    checkpoint = runs.model_for(where, tokenizer_folder, settings, seed=0)
    model, tokenizer = fixtures.load_model(checkpoint=checkpoint)
    examples = []
    for row in train.select(range(N)):
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        answer = answer[: settings.max_length - len(prompt) - 1]
        examples.append(fixtures.Example(prompt, answer))
    del docstring_data
    return "docstring data set, 8 rows up to 64 tokens, the Part 1 model", model, examples


def tensors(examples):
    example_tokens, maskables = [], []
    for example in examples:
        row = example.row()
        example_tokens.append(torch.tensor(row["input_ids"]))
        maskables.append(torch.tensor(row["completion_mask"], dtype=torch.bool))
    return example_tokens, maskables


def render(name, results, keys):
    lines = [
        f"{name}; {keys} keys; n = {N} examples per step; fp32 on CPU",
        "",
        "| arm | forwards per example | loss variance | gradient variance ± s.e. | ratio, equal examples | ratio, equal compute |",
        "|---|---|---|---|---|---|",
    ]
    for arm, found in results.items():
        lines.append(
            f"| {arm} | {found['forwards per example']} | {found['loss variance']:.4g} | "
            f"{found['gradient variance']:.4g} ± {found['gradient variance standard error']:.2g} | "
            f"{found['gradient ratio, equal examples']:.3f} | "
            f"{found['gradient ratio, equal compute']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=256, help="noise keys per arm (default 256)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    if args.keys < 2:
        parser.error("--keys must be 2 or more")
    started = time.monotonic()
    report = {}
    with tempfile.TemporaryDirectory(prefix="udn-variance-") as where:
        for name, model, examples in (tiny_setting(), docstring_setting(where)):
            model.train()
            results = measure(model, *tensors(examples), args.keys)
            report[name] = results
            print(render(name, results, args.keys) + "\n", flush=True)
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"keys": args.keys, "examples per step": N, "settings": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

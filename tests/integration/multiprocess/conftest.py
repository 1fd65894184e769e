"""What the launched layouts are compared with: the same case trained in this process."""

import pytest


@pytest.fixture(scope="module")
def one_process_masks():
    """one_process_masks(case) -> {layout: {generator seed: [own tokens, masked]}} for the case's examples
    trained with per-sample noise in one process, as 1 rank x GA 4 and as 1 rank x batch 4; every window
    is also judged by the oracle."""
    from unsloth_diffusion_norm.proof import experiment, judging
    from unsloth_diffusion_norm.proof.dp_cases import CASES

    def masks(name):
        case, layouts = CASES[name], {}
        for layout, shape in {
            "1 rank x GA 4": dict(gradient_accumulation_steps=4),
            "1 rank x batch 4": dict(gradient_accumulation_steps=1, batch_size=4),
        }.items():
            run = experiment.train(case.examples(), seed=case.seed, diffusion_noise="per_sample", **shape)
            assert all(judging.judge(run, window).ok for window in run.windows), layout
            found = judging.masks_by_sample([(w.batches, w.rng_state) for w in run.windows])
            layouts[layout] = {key: [list(tokens), list(masked)] for key, (tokens, masked) in found.items()}
        return layouts

    return masks

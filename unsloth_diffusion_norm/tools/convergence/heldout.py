"""The held-out measurements of Part 2, from evaluation noise that holds still.

Every held-out row gets K draws keyed as `diffusion_eval_noise="fixed"` keys them (evaluation.eval_key of
the run's seed, the row's position in the eval set, the draw; one rank, one row per eval batch), replayed by
the oracle's independent noise recipe. The masks are drawn once, before training, and every measurement of
every arm of a seed reads the same ones: a difference between two arms is a difference between models, not
between draws. Nothing here touches a global generator, so measuring leaves the training draws alone.

From one pass over those draws:
- `objective`: NVIDIA's objective, window-normalized: Σ CE/p over every masked token of every row and draw,
  divided by their number;
- `bound`: the per-token bound a likelihood evaluation reports: per row the mean over draws of Σ CE/p (the
  masked-diffusion bound on -log p(answer), eps-floored), summed over rows, divided by the rows' answer tokens;
- `eval_loss`: what the trainer's `evaluate()` reports under the fixed noise at eval batch 1 (each draw by
  its own masked tokens, the mean over draws and rows), which the quick test holds it to;
- `accuracy`: masked-token accuracy (argmax) by the draw's noise level, in NOISE_BINS.
"""

NOISE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class HeldOut:
    """The held-out rows of a run and their keyed draws; `bind(trainer)` before the first `measure(model)`."""

    def __init__(self, draws):
        self.draws = draws
        self.rows = None  # [(oracle.Masks for the K draws of a row, t per draw)]
        self.mask_id = None

    def bind(self, trainer):
        """The trainer's own held-out rows (its eval dataset, as its collator batches them one at a time) and
        their draws under the trainer's seed; returns self."""
        import torch

        from ...evaluation import eval_key
        from ...proof import oracle

        args = trainer.args
        eos_id = trainer.processing_class.eos_token_id
        self.mask_id = trainer.processing_class.mask_token_id
        eps = oracle.OBJECTIVES["nemotron_labs_diffusion"].eps
        self.rows = []
        for position in range(len(trainer.eval_dataset)):
            batch = trainer.data_collator([trainer.eval_dataset[position]])
            keys = [eval_key(args.seed, position, draw) for draw in range(self.draws)]
            repeated = {name: batch[name].repeat(self.draws, 1) for name in ("input_ids", "labels", "attention_mask")}
            repeated = {name: value for name, value in repeated.items() if value is not None}
            (masks,) = oracle.replay_noise([{**repeated, "keys": keys}], torch.get_rng_state(), eps, eos_id)
            self.rows.append((masks, (masks.p_mask[:, 0] - eps) / (1 - eps)))
        return self

    def measure(self, model):
        """{objective, bound, eval_loss, accuracy: [per NOISE_BINS bin, None where no token fell]} of `model`."""
        import torch

        with torch.no_grad():
            return self._measure(model)

    def _measure(self, model):  # (under no_grad)
        import torch
        import torch.nn.functional as F

        training = model.training
        model.eval()
        device = next(model.parameters()).device
        weighted = masked_tokens = bound = answer_tokens = own = 0.0
        bins = len(NOISE_BINS) - 1
        right, seen = torch.zeros(bins, dtype=torch.float64), torch.zeros(bins, dtype=torch.float64)
        for masks, t in self.rows:
            tokens, masked = masks.tokens.to(device), masks.masked.to(device)
            logits = model(input_ids=torch.where(masked, self.mask_id, tokens)).logits.float()
            token_loss = F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none").double()
            token_loss = torch.where(masked, token_loss / masks.p_mask.to(device), 0.0)
            per_draw, count = token_loss.sum(dim=1).cpu(), masked.sum(dim=1).cpu()
            weighted += per_draw.sum().item()
            masked_tokens += count.sum().item()
            bound += per_draw.mean().item()
            answer_tokens += masks.maskable[0].sum().item()
            own += (per_draw / count.clamp_min(1)).mean().item()
            correct = ((logits.argmax(dim=-1) == tokens) & masked).sum(dim=1).cpu().double()
            where = torch.bucketize(t, torch.tensor(NOISE_BINS[1:-1]), right=True)
            right.index_add_(0, where, correct)
            seen.index_add_(0, where, count.double())
        model.train(training)
        return {
            "objective": weighted / max(masked_tokens, 1),
            "bound": bound / max(answer_tokens, 1),
            "eval_loss": own / len(self.rows),
            "accuracy": [(r / s).item() if s > 0 else None for r, s in zip(right, seen)],
        }

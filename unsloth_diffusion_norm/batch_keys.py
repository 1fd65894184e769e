"""Every key the plugin puts in a batch dict, and why each must ride there: the loss is reached only through
Trainer's and Unsloth's own code (get_batch_samples -> training_step -> compute_loss -> the profile's compute_loss;
prediction_step -> compute_loss -> the profile's), which passes a batch dict and nothing else of ours. A wrapper
reads a key once, at the end of that road, and hands what it holds to the noise as arguments."""

# Unsloth 2026.10.7+'s own key: the prepared noise (input_ids, forward mask, maskable, masked, p_mask) its
# compute_loss reads instead of drawing.
UNSLOTH_PREPARED = "_diffusion_masked_batch"
# A training micro-batch's index in its window: written when the window is fetched (get_batch_samples), read by the
# profile's compute_loss, which takes the window's noise for that micro-batch.
SLOT = "_diffusion_norm_slot"
# Per-sample noise: each row's generator seed and stratum (per_sample.Rows), written when the micro-batch is fetched
# (the data order is known there and nowhere later), read where its noise is drawn: the profile's compute_loss on
# 2026.10.4-.6, the profile's prepare_batch that upstream's get_batch_samples calls on 2026.10.7+.
ROWS = "_diffusion_norm_keys"
# Keyed evaluation (diffusion_eval_noise="fixed"): per draw, each row's generator seed, written in prediction_step
# (the eval position is known there), read by the profile's compute_loss.
EVAL = "_diffusion_norm_eval_keys"

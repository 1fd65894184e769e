"""Config of the tiny Nemotron-Labs-Diffusion stand-in (shipped as remote code next to its weights)."""

from transformers import PretrainedConfig


class NemotronLabsDiffusionConfig(PretrainedConfig):
    model_type = "nemotron_labs_diffusion"

    def __init__(
        self,
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        mask_token_id=None,
        dp_varying_mask_ratio=False,  # NVIDIA's switch: vary the masks per data-parallel rank
        # NVIDIA's training modes: "bidirectional" (as the checkpoint ships) or "block_diff" (its SFT recipe's);
        # block_diff's blocks, and the weight its own (sum, count) loss gives the AR term.
        dlm_paradigm="bidirectional",
        block_size=32,
        ar_loss_weight=1.0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.mask_token_id = mask_token_id
        self.dp_varying_mask_ratio = dp_varying_mask_ratio
        self.dlm_paradigm = dlm_paradigm
        self.block_size = block_size
        self.ar_loss_weight = ar_loss_weight
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

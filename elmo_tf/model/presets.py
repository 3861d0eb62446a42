"""Named model sizes: the paper's `original` and a `small` one that trains on 2 CPU cores in minutes."""

from __future__ import annotations

from typing import Any

from elmo_tf.model.config import BiLMConfig

_PRESETS: dict[str, dict[str, Any]] = {
    # Peters et al. 2018 / bilm-tf: 2x4096_512_2048cnn_2xhighway, 8192 negatives, batch 128 x 20.
    "original": {
        "char_cnn": {
            "activation": "relu",
            "embedding": {"dim": 16},
            "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
            "max_characters_per_token": 50,
            "n_characters": 262,
            "n_highway": 2,
        },
        "lstm": {
            "cell_clip": 3,
            "dim": 4096,
            "n_layers": 2,
            "proj_clip": 3,
            "projection_dim": 512,
            "use_skip_connections": True,
        },
        "batch_size": 128,
        "unroll_steps": 20,
        "n_negative_samples_batch": 8192,
        "dropout": 0.1,
        "all_clip_norm_val": 10.0,
        "n_epochs": 10,
        "n_tokens_vocab": 793471,
        "bidirectional": True,
    },
    # Same recipe, narrower: F = 512, 1 highway, LSTM 1024 -> 128, 20k vocabulary, 2048 negatives.
    "small": {
        "char_cnn": {
            "activation": "relu",
            "embedding": {"dim": 16},
            "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]],
            "max_characters_per_token": 50,
            "n_characters": 262,
            "n_highway": 1,
        },
        "lstm": {
            "cell_clip": 3,
            "dim": 1024,
            "n_layers": 2,
            "proj_clip": 3,
            "projection_dim": 128,
            "use_skip_connections": True,
        },
        "batch_size": 32,
        "unroll_steps": 20,
        "n_negative_samples_batch": 2048,
        "dropout": 0.1,
        "all_clip_norm_val": 10.0,
        "n_epochs": 1,
        "n_tokens_vocab": 20000,
        "bidirectional": True,
    },
}

PRESET_NAMES = tuple(_PRESETS)


def preset(name: str) -> BiLMConfig:
    """The named preset as a `BiLMConfig` (its training fields hold the recipe's defaults)."""
    if name not in _PRESETS:
        raise ValueError(f"Unknown preset {name!r}; choose one of {list(PRESET_NAMES)}.")
    return BiLMConfig.from_dict(_PRESETS[name])

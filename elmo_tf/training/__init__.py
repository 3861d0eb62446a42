"""Training the biLM: the corpus as windows, the recipe's settings, the trainer, and its checkpoints.

`from elmo_tf import training` gives the public API of the part: `Trainer`, `TrainConfig`, `recipe_config`,
`make_strategy`, `restore_trainer`, `restore_bilm`, `checkpoint_prefixes`, `restore_checkpoint`, and the zero-state
health check of a checkpoint: `checkpoint_health`, `require_healthy` (`health` holds its record and verdict).
"""

from elmo_tf.training import health, setup
from elmo_tf.training.checkpoints import checkpoint_prefixes, restore_bilm, restore_checkpoint
from elmo_tf.training.config import TrainConfig, recipe_config, training_options
from elmo_tf.training.trainer import (
    Trainer,
    checkpoint_health,
    make_strategy,
    require_healthy,
    restore_trainer,
)

__all__ = [
    "TrainConfig",
    "Trainer",
    "checkpoint_health",
    "checkpoint_prefixes",
    "health",
    "make_strategy",
    "recipe_config",
    "require_healthy",
    "restore_bilm",
    "restore_checkpoint",
    "restore_trainer",
    "setup",
    "training_options",
]

"""Training the biLM: the corpus as windows, the recipe's settings, the trainer, and its checkpoints.

`from elmo_tf import training` gives the public API of the part: `Trainer`, `TrainConfig`, `recipe_config`,
`make_strategy`, `restore_trainer`, `restore_bilm`, `checkpoint_prefixes`, `restore_checkpoint`.
"""

from elmo_tf.training import setup
from elmo_tf.training.checkpoints import checkpoint_prefixes, restore_bilm, restore_checkpoint
from elmo_tf.training.config import TrainConfig, recipe_config, training_options
from elmo_tf.training.trainer import Trainer, make_strategy, restore_trainer

__all__ = [
    "TrainConfig",
    "Trainer",
    "checkpoint_prefixes",
    "make_strategy",
    "recipe_config",
    "restore_bilm",
    "restore_checkpoint",
    "restore_trainer",
    "setup",
    "training_options",
]

"""Training the biLM: the corpus as windows, the recipe's settings, the trainer, and its checkpoints.

`from elmo_tf import training` gives the public API of the part: `Trainer`, `TrainConfig`, `recipe_config`,
`make_strategy`, `restore_trainer`, `restore_bilm`, `restore_softmax`, `checkpoint_prefixes`, `restore_checkpoint`,
`is_weights_folder`, and the zero-state
health check of a checkpoint: `checkpoint_health`, `require_healthy` (`health`: this gate, and the check's record and
verdict); `run_length`: what bounds a run, about how many steps it takes, and how long on this machine; `run_setup`:
what a run starts from (options, vocabulary), checked before it starts; and what `train.py` does: `train_and_export`
(train, check the final checkpoint, export it) and `evaluate_run` (`workflow.py`).
"""

from elmo_tf.training import health, run_length, run_setup
from elmo_tf.training.checkpoints import checkpoint_prefixes, is_weights_folder, restore_bilm, restore_checkpoint, restore_softmax
from elmo_tf.training.config import TrainConfig, recipe_config, training_options
from elmo_tf.training.health import checkpoint_health, require_healthy
from elmo_tf.training.strategy import make_strategy
from elmo_tf.training.trainer import Trainer, restore_trainer
from elmo_tf.training.workflow import evaluate_run, train_and_export

__all__ = [
    "TrainConfig",
    "Trainer",
    "checkpoint_health",
    "checkpoint_prefixes",
    "evaluate_run",
    "health",
    "is_weights_folder",
    "make_strategy",
    "recipe_config",
    "require_healthy",
    "restore_bilm",
    "restore_checkpoint",
    "restore_softmax",
    "restore_trainer",
    "run_length",
    "run_setup",
    "train_and_export",
    "training_options",
]

"""What a reader of a model format returns: the biLM, and what the format carries beyond its weights.

The readers of ELMoForManyLangs folders and of TF1 TF-Hub modules give a `LoadedBiLM`: the biLM, whose options
carry the model's own trained layer mix where the format has one, and the reader's notes. Everything downstream
(export, the `Embedder`, continued pretraining) takes the `bilm`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from elmo_tf.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TrainedMix:
    """A trained ELMo scalar mix: `scale * sum_j softmax(weights)_j * layer_j`.

    Attributes:
      weights: the un-normalised weights, one per output layer (L + 1).
      scale: gamma, the mix's scale.
    """

    weights: tuple[float, ...]
    scale: float = 1.0

    def __post_init__(self):
        weights = tuple(float(w) for w in self.weights)
        if not weights or not all(math.isfinite(w) for w in weights):
            raise ConfigError(f"A trained mix needs finite weights, one per output layer; found {list(self.weights)!r}.")
        if not math.isfinite(float(self.scale)):
            raise ConfigError(f"A trained mix needs a finite scale; found {self.scale!r}.")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "scale", float(self.scale))

    @classmethod
    def from_values(cls, weights: Sequence[float], scale: float) -> "TrainedMix":
        return cls(tuple(weights), scale)

    def to_dict(self) -> dict:
        return {"weights": list(self.weights), "scale": self.scale}


@dataclasses.dataclass
class LoadedBiLM:
    """A biLM read from a file format, and what the reader had to choose because the files do not say it.

    Attributes:
      bilm: the `BiLM`, built and loaded; its options carry the format's own trained mix, if it has one
        (`bilm.config.mix`), and its lexicons (`bilm.lexicons`).
      notes: one line each, for the user.
      cache_tokens: the tokens of the biLM's token cache, in the vocabulary's order (None without a cache).
    """

    bilm: object
    notes: tuple[str, ...] = ()
    cache_tokens: Optional[tuple[str, ...]] = None

    @property
    def mix(self) -> Optional[TrainedMix]:
        """The format's own trained layer mix, or None."""
        mix = self.bilm.config.mix
        return None if mix is None else TrainedMix.from_values(mix["weights"], mix["scale"])

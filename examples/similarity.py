"""Embeds a few sentences with an exported module and prints their cosine similarities.

    python examples/similarity.py --module=hub_module
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # elmo_tf from this checkout

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

flags.DEFINE_string("module", "hub_module", "An exported elmo_tf module (export.py).")
flags.DEFINE_multi_string("sentence", None, "Sentences to compare (repeat the flag); a default set otherwise.")
flags.DEFINE_string("word", "bank", "A word whose occurrences in the sentences are compared layer by layer.")
FLAGS = flags.FLAGS

DEFAULT_SENTENCES = [
    "I deposited the cheque at the bank .",
    "The bank approved my loan .",
    "We sat on the grassy bank of the river .",
    "北京 是 中国 的 首都 。",
]


def main(argv):
    del argv
    from elmo_tf.utils.env import import_tensorflow

    import_tensorflow(quiet=not FLAGS["verbosity"].present)  # TensorFlow's start-up lines only with --verbosity
    import tensorflow as tf

    module = tf.saved_model.load(FLAGS.module)
    sentences = FLAGS.sentence or DEFAULT_SENTENCES
    out = module.signatures["default"](text=tf.constant(sentences))
    vectors = out["default"].numpy()  # [B, 2P]: mean of ELMo over each sentence's tokens
    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    print(f"elmo {tuple(out['elmo'].shape)}, sequence_len {out['sequence_len'].numpy().tolist()}")
    print("Cosine similarity of the sentence vectors (`default` output):")
    for i, s in enumerate(sentences):
        row = " ".join(f"{v:+.3f}" for v in vectors @ vectors[i])
        print(f"  [{i}] {row}   {s}")

    # The same word in different sentences: identical in the context-free layer, different in the LSTM layers.
    where = [(i, tokens.index(FLAGS.word)) for i, tokens in enumerate(s.split() for s in sentences) if FLAGS.word in tokens]
    if len(where) < 2:
        return
    layers = ["word_emb"] + sorted(k for k in out if k.startswith("lstm_outputs")) + ["elmo"]
    print(f"Cosine similarity of {FLAGS.word!r} in sentences {[i for i, _ in where]}, per layer:")
    closest = {}
    for key in layers:
        vecs = np.stack([out[key].numpy()[i, k] for i, k in where])
        vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        sims = vecs @ vecs.T
        pairs = {(a, b): sims[x, y] for x, (a, _) in enumerate(where) for y, (b, _) in enumerate(where) if x < y}
        closest[key] = max(pairs, key=pairs.get)
        print(f"  {key:15s} " + " ".join(f"{a}-{b}: {v:+.3f}" for (a, b), v in pairs.items()))
    print("word_emb is context-free (identical vectors); the LSTM layers give each occurrence its own vector.")
    if sentences == DEFAULT_SENTENCES:
        # Sentences 0 and 1 use the money sense, 2 the river sense: say plainly what this model shows.
        separated = [key for key in layers[1:] if closest[key] == (0, 1)]
        if len(separated) == len(layers) - 1:
            print("The two money senses (0-1) are the closest pair in every contextual layer.")
        else:
            where_text = f"only in {', '.join(separated)}" if separated else "in no layer"
            print(f"The two money senses (0-1) are the closest pair {where_text}. A `small` biLM trained on a few "
                  "million words does not reliably group word senses in this example (run.sh's 600-step model and the "
                  "5,453-step one of docs/TRAINING_AUDIT.md alike): nearby words weigh more ('the bank' in 0 and 2). "
                  "The paper's word-sense results come from its 4096-unit model trained on a billion words.")


if __name__ == "__main__":
    app.run(main)

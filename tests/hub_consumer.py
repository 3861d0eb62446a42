"""Child process for tests/export/test_hub_export.py: uses an exported module through `hub.KerasLayer` in tf_keras.

`hub.KerasLayer` needs tf_keras (Keras 2), which TensorFlow only selects when TF_USE_LEGACY_KERAS=1 is
set before TensorFlow is first imported; the test process runs Keras 3, so this runs in its own process:

    TF_USE_LEGACY_KERAS=1 python tests/hub_consumer.py < JOBS.json

It reads the jobs from stdin once it has imported TensorFlow, so it can be started before the modules they read
exist. JOBS.json is a list of jobs; each writes `<out>.npz` + `<out>.json`, or `<out>.error` with the traceback:
  {"kind": "embed", "module": PATH, "texts": [...], "out": PREFIX}
      a tf_keras functional model `Input(string) -> hub.KerasLayer(PATH, output_key="elmo")`;
      saves its `elmo` output (model.predict) and the Keras version used.
  {"kind": "finetune", "module": PATH, "output_key": "elmo"|"default", "texts": [...], "labels": [...],
   "out": PREFIX}
      `hub.KerasLayer(PATH, output_key=..., trainable=True)` -> (pooling) -> Dense(1), a few steps of
      `model.fit` with Adam; saves every module variable before and after training (by name), the
      layer's trainable / non-trainable variable names, and the module's outputs after training.
The exit code is 1 if any job failed.
"""

from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # must precede the first TensorFlow import
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_hub as hub  # noqa: E402
import tf_keras  # noqa: E402


def _string_input():
    return tf_keras.Input(shape=(), dtype=tf.string, name="text")


def embed(job):
    inputs = _string_input()
    layer = hub.KerasLayer(job["module"], output_key="elmo")
    model = tf_keras.Model(inputs, layer(inputs))
    texts = np.array(job["texts"], dtype=object)
    elmo = model.predict(texts, batch_size=len(texts), verbose=0)
    np.savez(job["out"] + ".npz", elmo=elmo)
    info = {"keras_module": type(model).__module__, "tf_keras_version": tf_keras.__version__}
    with open(job["out"] + ".json", "w") as f:
        json.dump(info, f)


def _snapshot(variables):
    return {v.name: np.array(v.numpy(), copy=True) for v in variables}


def finetune(job):
    tf_keras.utils.set_random_seed(0)
    output_key = job["output_key"]
    inputs = _string_input()
    layer = hub.KerasLayer(job["module"], output_key=output_key, trainable=True)
    x = layer(inputs)
    if output_key == "elmo":
        x = tf_keras.layers.GlobalAveragePooling1D()(x)  # [B, T, 2P] -> [B, 2P]
    logits = tf_keras.layers.Dense(1)(x)
    model = tf_keras.Model(inputs, logits)
    model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate=0.05),
        loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
    )
    texts = np.array(job["texts"], dtype=object)
    labels = np.array(job["labels"], dtype=np.float32)[:, None]

    module_vars = list(layer.variables)
    names = [v.name for v in module_vars]
    if len(set(names)) != len(names):
        raise AssertionError(f"module variable names are not unique: {names}")
    before = _snapshot(module_vars)
    history = model.fit(texts, labels, epochs=3, batch_size=4, shuffle=False, verbose=0)
    after = _snapshot(module_vars)

    # The module's outputs after training, from the very object the layer trained.
    outputs = layer.resolved_object(tf.constant(job["texts"]), training=False)
    arrays = {f"before/{i}": before[n] for i, n in enumerate(names)}
    arrays.update({f"after/{i}": after[n] for i, n in enumerate(names)})
    arrays.update({f"out/{k}": v.numpy() for k, v in outputs.items()})
    np.savez(job["out"] + ".npz", **arrays)
    info = {
        "names": names,
        "trainable": [v.name for v in layer.trainable_weights],
        "non_trainable": [v.name for v in layer.non_trainable_weights],
        "loss": [float(v) for v in history.history["loss"]],
        "output_keys": sorted(outputs),
    }
    with open(job["out"] + ".json", "w") as f:
        json.dump(info, f)


def main():
    jobs = json.load(sys.stdin)
    failed = 0
    for job in jobs:
        try:
            {"embed": embed, "finetune": finetune}[job["kind"]](job)
        except Exception:  # noqa: BLE001 - reported to the parent test through the .error file
            failed += 1
            with open(job["out"] + ".error", "w") as f:
                f.write(traceback.format_exc())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared checks for every elmo_tf layer: config round trip, eager and symbolic calls, gradients."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def _first(output):
    while isinstance(output, (tuple, list)):
        output = output[0]
    return output


def check_layer(layer_cls, init_kwargs: dict, inputs, call_kwargs: dict | None = None, symbolic_dtype="float32"):
    """Runs the standard checks and returns the eager output of a built layer.

    * `get_config` -> `from_config` gives an equal config, and (with copied weights) equal outputs;
    * `keras.saving.serialize_keras_object` / `deserialize_keras_object` restores the class;
    * a symbolic call on `keras.Input` gives the eager output's static shape (batch left unknown);
    * every trainable weight receives a gradient.
    """
    call_kwargs = call_kwargs or {}
    layer = layer_cls(**init_kwargs)
    output = layer(inputs, **call_kwargs)  # eager
    first = _first(output)

    config = layer.get_config()
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config
    clone(inputs, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(_first(clone(inputs, **call_kwargs)).numpy(), first.numpy())

    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is layer_cls and restored.get_config() == config

    inputs_np = np.asarray(inputs)
    symbolic_in = keras.Input(shape=inputs_np.shape[1:], dtype=symbolic_dtype if inputs_np.dtype.kind == "f" else "int32")
    symbolic_out = _first(layer_cls(**init_kwargs)(symbolic_in, **call_kwargs))
    assert tuple(symbolic_out.shape)[1:] == tuple(first.shape)[1:], (symbolic_out.shape, first.shape)

    if layer.trainable_weights:
        x = tf.convert_to_tensor(inputs)
        with tf.GradientTape() as tape:
            if x.dtype.is_floating:
                tape.watch(x)
            outputs = tf.nest.flatten(layer(x, **call_kwargs))
            loss = tf.add_n([tf.reduce_sum(tf.square(o)) for o in outputs])
        grads = tape.gradient(loss, layer.trainable_weights)
        missing = [w.path for w, g in zip(layer.trainable_weights, grads) if g is None]
        assert not missing, f"no gradient for {missing}"
    return layer, output

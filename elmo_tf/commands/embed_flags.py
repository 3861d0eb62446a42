"""Flags shared by the embedding commands (`elmo_tf.embed`, `elmo_tf.embed_beam`): what each line gives."""

from __future__ import annotations

from typing import Optional

from absl import app, flags

from elmo_tf.utils.flag_checks import EXIT_USAGE, check_float, check_number_list

# Bad input exits with this code (as a bad flag value: elmo_tf/utils/flag_checks.py).
EXIT_BAD_INPUT = EXIT_USAGE


def usage_error(message: str) -> app.UsageError:
    return app.UsageError(message, exitcode=EXIT_BAD_INPUT)


def define_output_flags() -> None:
    """--layers, --mix_weights, --gamma, --dtype."""
    flags.DEFINE_enum("layers", "all", ["all", "top", "average", "mix"],
                      "all: [L+1, n, 2P] per line; top: last biLSTM layer; average: mean of the L+1 layers; "
                      "mix: softmax(--mix_weights) weighted sum times --gamma. The others are [n, 2P].")
    flags.DEFINE_list("mix_weights", None, "With --layers=mix: L + 1 comma-separated un-normalised weights.")
    check_number_list("mix_weights")
    flags.DEFINE_float("gamma", 1.0, "With --layers=mix: the scale of the mixed layers.")
    check_float("gamma")
    flags.DEFINE_enum("dtype", "float32", ["float32", "float16"], "Type of the stored embeddings.")


def define_tokenized_flag(original_files: bool) -> None:
    """--tokenized: unset follows the model's own tokenizer; true / false say how lines are split.

    Args:
      original_files: the command also takes --options_file (whose model names no tokenizer: whitespace).
    """
    flags.DEFINE_bool(
        "tokenized", None,
        "How lines are split into tokens. Unset (default): as the model splits raw text, with the module's own "
        "tokenizer (export.py --tokenizer: whitespace, or cjk_chars: every CJK ideograph a token)"
        + (", on whitespace with --options_file" if original_files else "")
        + ". true: lines are already whitespace-tokenized, each whitespace-separated piece is one token. false: "
        "the module's in-graph tokenizer" + (" (needs --module)." if original_files else "."))


def mix_weights_from_flags() -> Optional[list[float]]:
    """Checks --layers / --mix_weights / --gamma together; returns the mix weights (None unless --layers=mix)."""
    FLAGS = flags.FLAGS
    if FLAGS.layers == "mix" and not FLAGS.mix_weights:
        raise usage_error("--layers=mix needs --mix_weights (L + 1 comma-separated numbers).")
    if FLAGS.layers != "mix" and (FLAGS.mix_weights or FLAGS["gamma"].present):
        raise usage_error("--mix_weights and --gamma apply to --layers=mix only.")
    if not FLAGS.mix_weights:
        return None
    return [float(w) for w in FLAGS.mix_weights]  # finite numbers: checked when the flags were parsed

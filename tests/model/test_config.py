import json

import pytest

from elmo_tf.model.config import BiLMConfig, ConfigError
from tests.conftest import FIXTURES

FULL = FIXTURES / "elmo_2x4096_512_2048cnn_2xhighway_options.json"


def load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("path", [FULL, FIXTURES / "tiny" / "options.json", FIXTURES / "tiny2" / "options.json"])
def test_round_trip_of_original_files(path, tmp_path):
    config = BiLMConfig.from_json_file(str(path))
    assert config.to_dict() == load(path)
    out = tmp_path / "options.json"
    config.to_json_file(str(out))
    assert BiLMConfig.from_json_file(str(out)) == config


def test_derived_values_of_the_published_model():
    config = BiLMConfig.from_json_file(str(FULL))
    assert config.char_cnn.n_filters == 2048
    assert config.has_token_projection and config.lstm.has_projection
    assert config.lstm.output_dim == 512 and config.output_dim == 1024 and config.num_output_layers == 3


def test_projection_flags_follow_the_original_rules():
    options = load(FIXTURES / "tiny" / "options.json")
    options["lstm"].update(projection_dim=28, dim=28)  # F == P == H: neither projection
    config = BiLMConfig.from_dict(options)
    assert not config.has_token_projection and not config.lstm.has_projection


def test_training_fields_survive_round_trip():
    options = load(FULL)
    options.update(bidirectional=True, dropout=0.1, n_tokens_vocab=793471, unroll_steps=20, n_negative_samples_batch=8192,
                   all_clip_norm_val=10.0, batch_size=128, n_epochs=10, n_train_tokens=768648884)
    assert BiLMConfig.from_dict(options).to_dict() == options


def test_n_characters_261_from_the_original_trainer_is_accepted():
    options = load(FULL)
    options["char_cnn"]["n_characters"] = 261
    assert BiLMConfig.from_dict(options).char_cnn.n_characters == 261


def _mutate(path, value):
    def apply(options):
        target = options
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return options

    return apply


_DELETE = object()


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("char_cnn", "n_characters"), 300, r"char_cnn.n_characters.*300.*262"),
        (("char_cnn", "activation"), "gelu", r"char_cnn.activation.*'gelu'.*relu"),
        (("char_cnn", "filters"), [[1, 32], [2]], r"char_cnn.filters\[1\].*\[2\]"),
        (("char_cnn", "filters"), [], r"char_cnn.filters"),
        (("char_cnn", "filters"), [[60, 4]], r"filter widths <= max_characters_per_token \(50\)"),
        (("char_cnn", "n_highway"), -1, r"char_cnn.n_highway.*-1"),
        (("char_cnn", "max_characters_per_token"), 2, r"max_characters_per_token.*2"),
        (("char_cnn", "embedding", "dim"), 0, r"char_cnn.embedding.dim.*0"),
        (("lstm", "projection_dim"), 8192, r"lstm.projection_dim.*8192.*lstm.dim \(4096\)"),
        (("lstm", "projection_dim"), 4096, r"lstm.projection_dim.*4096.*F"),
        (("lstm", "n_layers"), 0, r"lstm.n_layers.*0"),
        (("lstm", "cell_clip"), -3, r"lstm.cell_clip.*-3"),
        (("lstm", "use_skip_connections"), "yes", r"use_skip_connections.*'yes'"),
        (("lstm", "dim"), "4096", r"lstm.dim.*'4096'"),
        (("lstm", "n_layer"), 2, r"Unknown ELMo option.*n_layer.*allowed keys"),
        (("lstm", "dim"), _DELETE, r"Missing ELMo option.*lstm.dim"),
        (("lstm",), _DELETE, r"Missing ELMo option.*lstm"),
        (("token_embedder",), {"layout": "efml", "word_dim": 4, "n_words": 0}, r"token_embedder.n_words.*0"),
        (("elmo_mix",), {"weights": [1, 2], "scale": 1}, r"elmo_mix.weights.*3 finite numbers"),
        (("token_embedder",), {"layout": "bilm_tf", "word_dim": 4}, r"word_dim.*efml"),
        (("learning_rate",), 0.2, r"Unknown ELMo option.*learning_rate"),
        (("bidirectional",), False, r"bidirectional.*False"),
    ],
)
def test_invalid_options_name_field_value_and_allowed(path, value, message):
    options = _mutate(path, value)(load(FULL))
    with pytest.raises(ConfigError, match=message):
        BiLMConfig.from_dict(options)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        BiLMConfig.from_json_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BiLMConfig.from_json_file(str(bad))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="UTF-8"):
        BiLMConfig.from_json_file(str(binary))

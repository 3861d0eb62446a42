"""Publishing a trained biLM (evaluation/publish.py) and the published biLMs under pretrained/."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from elmo_tf import training
from elmo_tf.model.config import BiLMConfig
from elmo_tf.model.weights_io import load_original
from elmo_tf.text.vocab import Vocabulary
from evaluation import publish
from tests.conftest import FIXTURES
from tests.doc_code import doc_code, shell_commands
from tests.train_worker import tiny_train_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLISHED = [os.path.join(REPO, "pretrained", name) for name in ("english_small", "chinese_small")]


def run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("publish")
    (root / "train.txt").write_text("the cat sat on the mat .\na dog ran in the park .\n" * 20)
    (root / "heldout.txt").write_text("the dog sat on the mat .\na cat ran .\n")
    vocab = Vocabulary.build(str(root / "train.txt"))
    config = BiLMConfig.from_json_file(str(FIXTURES / "tiny" / "options.json"))
    trainer = training.Trainer(config, vocab, tiny_train_config(3), str(root / "run"))
    summary = trainer.train(str(root / "train.txt"))
    card = publish.publish(
        str(root / "run"), str(root / "out"), name="tiny", language="English", tokenizer="whitespace",
        summary=dict(summary, steps=3, minutes=0.1, tokens_seen=3 * 2 * 5, vocab_size=vocab.size, train_lines=40),
        heldout_files=[str(root / "heldout.txt")], heldout_paths_in_repo=[str(root / "heldout.txt")],
        command="python evaluate.py --stages=lm_en", commit="abc", machine={"cpu": "x", "cpu_model": "", "cpu_flags": [],
                                                                              "cpu_count": 2, "tensorflow": "2.21.0"},
        corpus="a test corpus", effect_sentences=["the cat sat .", "a dog"])
    return root, card


@pytest.mark.slow
def test_published_folder_holds_the_run_and_its_card(published):
    root, card = published
    out = root / "out"
    assert sorted(os.listdir(out)) == ["MODEL_CARD.md", "card.json", "options.json", "vocab.txt", "weights.hdf5"]
    assert json.loads((out / "card.json").read_text()) == card
    for name, f in card["files"].items():
        assert publish.sha256(str(out / name)) == f["sha256"] and os.path.getsize(out / name) == f["bytes"]
    # the biLM loads as original files, with the weights of the run's last checkpoint
    ours = load_original(str(out / "options.json"), str(out / "weights.hdf5"))
    for a, b in zip(training.restore_bilm(str(root / "run")).weights, ours.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # the card's figures are those of the run itself, in both protocols (within the softmax's storage rounding)
    trainer = training.restore_trainer(str(root / "run"))
    figures = card["heldout"]["heldout.txt"]
    rtol = 1e-5 if card["storage"]["softmax"] == "float32" else publish.SOFTMAX_FLOAT16_TOLERANCE
    for protocol, kwargs in (("carried_state", {}), ("zero_state", {"sentence_by_sentence": True})):
        expected = trainer.evaluate(str(root / "heldout.txt"), **kwargs)
        for key in ("perplexity_forward", "perplexity_backward"):
            np.testing.assert_allclose(figures[protocol][key], expected[key], rtol=rtol)
    effect = card["storage"]["float16_effect"]
    assert len(effect["bilm_weights_float16"]) == 3 and all(0 < x["relative"] < 1e-2 for x in effect["bilm_weights_float16"])
    text = (out / "MODEL_CARD.md").read_text()
    assert f"train.py --mode=eval --save_dir=" in text and card["files"]["weights.hdf5"]["sha256"] in text


def test_committed_cards_are_what_publish_writes():
    """MODEL_CARD.md of each published biLM is model_card() of its card.json, as written from the repository's root:
    a fix to the template is made to the committed cards too (the module name `elmo_zh`, the README section)."""
    for folder in PUBLISHED:
        committed = open(os.path.join(folder, publish.CARD_MD), encoding="utf-8").read()
        assert publish.model_card(publish.read_card(folder), os.path.relpath(folder, REPO)) == committed, folder
    chinese = open(os.path.join(PUBLISHED[1], publish.CARD_MD), encoding="utf-8").read()
    assert "--export_dir=elmo_zh --tokenizer=cjk_chars" in chinese


def test_language_codes_name_the_modules_as_the_docs_do():
    assert [publish.language_code(x) for x in ("English", "Chinese")] == ["en", "zh"]
    with pytest.raises(ValueError, match="No language code for 'Klingon'"):
        publish.language_code("Klingon")


@pytest.mark.slow
@pytest.mark.parametrize("folder", PUBLISHED, ids=os.path.basename)
def test_published_bilm_is_what_its_card_lists(folder):
    """A published biLM's files are those its card lists, it loads through export.py's loader, its card's commands
    name its folder and held-out files that exist, and zero state is within 1.2x of carried on every file."""
    card = publish.read_card(folder)
    for name, f in card["files"].items():
        assert publish.sha256(os.path.join(folder, name)) == f["sha256"], name
    load_original(os.path.join(folder, "options.json"), os.path.join(folder, "weights.hdf5"))
    commands = publish.card_eval_commands(folder)
    assert sorted(commands) == sorted(card["heldout"])
    for file, args in commands.items():
        assert args[:3] == ["train.py", "--mode=eval", f"--save_dir={os.path.relpath(folder, REPO)}"]
        assert os.path.isfile(os.path.join(REPO, args[3].partition("=")[2])), args
    for f in card["heldout"].values():
        assert f["zero_state"]["perplexity"] <= 1.2 * f["carried_state"]["perplexity"]


@pytest.mark.slow
def test_published_bilm_reproduces_its_card():
    """The Chinese card's command for its smallest held-out file, run as written, gives the card's figures (both
    protocols, both directions). Every file of both cards: benchmarks/published_cards.py (the English card's smallest
    file alone is 100k tokens, minutes of a 2-core machine)."""
    folder = PUBLISHED[1]
    card = publish.read_card(folder)
    file = min(card["heldout"], key=lambda f: card["heldout"][f]["tokens"])
    result = run(*publish.card_eval_commands(folder)[file])
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    want = card["heldout"][file]
    for protocol, figures in (("carried_state", got), ("zero_state", got["zero_state"])):
        for key in ("perplexity_forward", "perplexity_backward"):
            np.testing.assert_allclose(figures[key], want[protocol][key], rtol=1e-4, err_msg=f"{protocol} {key}")


@pytest.mark.slow
def test_readme_pretrained_commands_run_as_written(tmp_path):
    """The README's two commands (export a published biLM, embed a file), as written, in a folder that holds what
    they name: English gives one vector per word, Chinese one per character (the module splits raw text itself)."""
    import h5py

    commands = shell_commands(doc_code("readme_pretrained_commands"))
    assert len(commands) == 2
    for name in ("export.py", "elmo_tf", "pretrained", "examples"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    for command in commands:
        command = command.replace(".venv/bin/python", sys.executable)
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    for lang, count in (("en", lambda line: len(line.split())), ("zh", len)):
        with open(os.path.join(REPO, "examples", f"sentences_{lang}.txt"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        with h5py.File(tmp_path / f"sentences_{lang}.hdf5", "r") as f:
            for i, line in enumerate(lines):
                layers, tokens, dim = f[str(i)].shape
                assert (layers, dim) == (3, 256) and tokens == count(line), (lang, i, line, f[str(i)].shape)

"""`evaluate.py --bilm_en=DIR --bilm_zh=DIR`: any biLM we read in place of the published ones (evaluation/bilm_source.py).

The folder's kind is told from its files; a model whose tokens are not those of its language's task, or a folder that
is no biLM, is refused on one line before any work. Slow: the smallest stage set (module_en) run from a TF1 hub
stand-in, whose module must give the original TF1 module's outputs, and the adaptation stage started from the folder
that stage converted it into (no softmax, no vocab.txt: a fresh softmax over the task's words).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from elmo_tf.errors import InputError
from evaluation import run_settings, stages
from evaluation.bilm_source import detect_bilm, fit_problem
from tests.one_device import train_on_one_device

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
TF1 = FIXTURES / "tiny_tf1_hub" / "module"
CHILD_TIMEOUT = 900  # seconds; the module_en run takes about a minute on a shared 2-core machine
SLOW_FIXTURES = {"module_run"}


def evaluate(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "evaluate.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


# -- which kind of folder ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder, kind, files", [
    ("efml/both", "efml", {"efml_dir"}),
    ("efml/chars", "efml", {"efml_dir"}),
    ("efml/words", "efml", {"efml_dir"}),
    ("tiny_tf1_hub/module", "tf1_hub", {"tf1_hub_dir"}),
    ("tiny", "original", {"options_file", "weight_file"}),
    ("tiny_word_input", "original", {"options_file", "weight_file", "embedding_file", "vocab_file"}),
])
def test_the_kind_is_told_from_the_files(folder, kind, files):
    source = detect_bilm(str(FIXTURES / folder))
    assert source.kind == kind and set(source.files) == files and source.path == str(FIXTURES / folder)
    assert source.word_input == (folder == "tiny_word_input") and not source.published
    for path in source.files.values():
        assert Path(path).exists() and Path(path).is_relative_to(FIXTURES / folder)


def test_allennlp_file_names_and_a_tf1_modules_options(tmp_path):
    allennlp = tmp_path / "elmo_small"
    allennlp.mkdir()
    shutil.copy(FIXTURES / "tiny" / "options.json", allennlp / "elmo_2x1024_128_2048cnn_1xhighway_options.json")
    shutil.copy(FIXTURES / "tiny" / "weights.hdf5", allennlp / "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5")
    source = detect_bilm(str(allennlp))
    assert source.kind == "original" and source.files == {
        "options_file": str(allennlp / "elmo_2x1024_128_2048cnn_1xhighway_options.json"),
        "weight_file": str(allennlp / "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5")}
    module = tmp_path / "module"
    shutil.copytree(TF1, module)
    shutil.copy(FIXTURES / "tiny" / "options.json", module / "options.json")
    assert detect_bilm(str(module)).files == {"tf1_hub_dir": str(module), "options_file": str(module / "options.json")}


def test_the_published_biLMs_are_read_by_their_cards():
    for lang, tokens in (("en", "whitespace"), ("zh", "cjk_chars")):
        source = detect_bilm(run_settings.published_dir(types.SimpleNamespace(pretrained_dir=str(REPO / "pretrained")), lang))
        assert (source.kind, source.tokens, source.published) == ("original", tokens, True)
        assert "model card" in source.tokens_evidence


# -- which tokens it reads, and whether they fit a task ------------------------------------------------------------
def test_a_word_segmented_chinese_model_is_refused_for_the_character_task():
    source = detect_bilm(str(FIXTURES / "efml" / "both"))  # word.dic: 中文, 你好 (words) and 好, 很
    assert source.tokens == "whitespace"
    problem = fit_problem(source, "cjk_chars", "Task zh_snownlp")
    assert problem and "\n" not in problem
    for part in ("ELMoForManyLangs", "2 of the 4 Chinese entries", "word.dic", "中文", "Task zh_snownlp", "cjk_chars"):
        assert part in problem, part
    assert fit_problem(source, "whitespace", "Task en_movie") is None


def test_a_vocabulary_of_single_characters_reads_chinese_as_characters(tmp_path):
    folder = tmp_path / "chars"
    shutil.copytree(FIXTURES / "tiny", folder)
    (folder / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n的\n是\nELMo\n，\n", encoding="utf-8")
    source = detect_bilm(str(folder))
    assert source.tokens == "cjk_chars" and "2 of the 2 Chinese entries" in source.tokens_evidence
    assert fit_problem(source, "cjk_chars", "Task zh_snownlp") is None
    assert "Task en_movie" in fit_problem(source, "whitespace", "Task en_movie")
    # Without a vocabulary or a card nothing shows characters: words, as every format's trainer reads.
    assert detect_bilm(str(FIXTURES / "tiny")).tokens == "whitespace"
    assert detect_bilm(str(TF1)).tokens == "whitespace"


def test_the_command_refuses_a_mismatched_biLM_on_one_line(tmp_path):
    proc = evaluate(f"--bilm_zh={FIXTURES / 'efml' / 'both'}", f"--run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evaluate.py: --bilm_zh: ") and "Task zh_snownlp" in lines[0]
    assert not (tmp_path / "run" / "state").exists()  # refused before any work


# -- bad folders ---------------------------------------------------------------------------------------------------
def test_a_bad_folder_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    tf2 = tmp_path / "tf2"
    tf2.mkdir()
    (tf2 / "saved_model.pb").write_bytes(b"")
    broken = tmp_path / "broken_module"
    broken.mkdir()
    (broken / "tfhub_module.pb").write_bytes(b"")
    word_input = tmp_path / "word_input"
    word_input.mkdir()
    for name in ("options.json", "weights.hdf5"):
        shutil.copy(FIXTURES / "tiny_word_input" / name, word_input / name)
    cases = {str(tmp_path / "missing"): "is not a folder", str(tmp_path / "empty"): "found nothing",
             str(tf2): "TF2 SavedModel", str(broken): "has no saved_model.pb, variables",
             str(word_input): "has no embedding.hdf5, vocab.txt"}
    for folder, expected in cases.items():
        with pytest.raises(InputError) as e:
            detect_bilm(folder)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    proc = evaluate(f"--bilm_en={tmp_path / 'empty'}", f"--run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"evaluate.py: --bilm_en: {tmp_path / 'empty'} holds no biLM we read: expected "
                                  "options.json + weights.hdf5")


def test_impossible_combinations(tmp_path):
    proc = evaluate(f"--bilm_en={FIXTURES / 'tiny'}", "--stages=lm_en", f"--run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and "--bilm_en replaces the published English biLM, which stage lm_en trains" in proc.stderr
    # A run folder holds one biLM per language: another one is refused instead of reusing the recorded stages.
    state = tmp_path / "run" / "state"
    state.mkdir(parents=True)
    (state / "module_en.json").write_text(json.dumps({"bilm": {"path": str(TF1)}, "seconds": 1}))
    proc = evaluate(f"--bilm_en={FIXTURES / 'tiny'}", "--stages=module_en", f"--run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and f"holds a run of the English biLM {TF1}" in proc.stderr


# -- the report ----------------------------------------------------------------------------------------------------
def test_the_report_names_each_biLM():
    from evaluation.page import markdown
    from evaluation.results import bilm_record

    en = bilm_record({"folder": "/run/bilms/en", "bilm": detect_bilm(str(TF1)).record(), "card": None}, given=True)
    published = str(REPO / "pretrained" / "chinese_small")
    card = json.loads((Path(published) / "card.json").read_text(encoding="utf-8"))
    zh = bilm_record({"folder": published, "bilm": detect_bilm(published).record(), "card": card}, given=False)
    assert (en["given"], zh["given"]) == (True, False) and "steps" not in en and zh["steps"] == card["training"]["steps"]
    budget = dict(dropout=0.1, hidden=8, head_epochs=1, min_head_steps=1, max_head_steps=1, head_learning_rate=0.01,
                  ft_epochs=1, batch_size=8, max_tokens_en=64, max_tokens_zh=128)
    results = {"setup": {"preset": "small", "budget": budget, "seeds": [0], "ft_sizes": [], "ft_seeds": [], "num_layers": 3,
                         "machine": "m", "command": "python evaluate.py"},
               "lm": {"en": en, "zh": zh}, "word2vec": {lang: {"vocab_size": 10, "dim": 8, "epochs": 1} for lang in "en zh".split()},
               "tasks": {}, "comparisons": {}, "polysemy": {}, "timings": {}, "run_minutes": 1.0,
               "adaptation": {"en_movie": {"steps": 2, "tokens_seen": 1280, "minutes": 0.1, "train_lines": 40, "dev_before": None,
                                           "dev_after": {"perplexity": 9.5, "perplexity_forward": 9.0, "perplexity_backward": 10.0,
                                                         "tokens": 50}}}}
    page = markdown(results, {"mix_weights": "results/mix_weights.png"})
    assert f"**In this run** the English biLM is `{TF1.relative_to(REPO)}` (TF1 TF-Hub module), given with `--bilm_en`" in page
    biLM_row = next(line for line in page.splitlines() if line.startswith("| biLM |"))
    assert f"`{TF1.relative_to(REPO)}` (TF1 TF-Hub module; reads `whitespace` tokens) |" in biLM_row
    assert (f"`pretrained/chinese_small` (published elmo_tf biLM: options.json + weights.hdf5; reads `cjk_chars` tokens): "
            f"`small` preset, {card['training']['steps']:,} steps") in biLM_row
    assert "| LM corpus of the biLM | — (not trained here) |" in page
    assert "dev perplexity after: 9.5" in page and "came without a softmax" in page
    assert "Perplexity while training" not in page  # no curve was given


# -- the stages, from a TF1 hub stand-in ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def module_run(tmp_path_factory):
    """`evaluate.py --bilm_en=<the TF1 stand-in> --stages=module_en`: the smallest stage set that uses the biLM."""
    root = tmp_path_factory.mktemp("bilm_en")
    proc = evaluate(f"--bilm_en={TF1}", "--stages=module_en", f"--run_dir={root / 'run'}", f"--docs_dir={root / 'docs'}",
                    timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, json.loads((root / "run" / "state" / "module_en.json").read_text())


def module_layers(module_dir: str) -> tuple[np.ndarray, dict, np.ndarray]:
    """The layers [N, 3, T, 2P] and ELMo [N, T, 2P] of a module on the TF1 fixture's sentences (its `tokens` signature),
    the reference the original TF1 module gave (tests/fixtures/tiny_tf1_hub/fixture) and the mask [N, T]."""
    import tensorflow as tf

    fixture = FIXTURES / "tiny_tf1_hub" / "fixture"
    sentences = [line.split() for line in (fixture / "sentences.txt").read_text(encoding="utf-8").splitlines()]
    ref = dict(np.load(fixture / "reference.npz"))
    lengths = [len(s) for s in sentences]
    T = max(lengths)
    tokens = tf.constant([s + [""] * (T - len(s)) for s in sentences])
    out = tf.saved_model.load(module_dir).signatures["tokens"](tokens=tokens, sequence_len=tf.constant(lengths))
    word = out["word_emb"].numpy()
    layers = np.stack([np.concatenate([word, word], -1), out["lstm_outputs1"].numpy(), out["lstm_outputs2"].numpy()], 1)
    ref = {"lm_embeddings": ref["lm_embeddings"][:, :, :T], "elmo": ref["elmo"][:, :T], "elmo_ours": out["elmo"].numpy()}
    return layers, ref, np.load(fixture / "reference.npz")["mask"][:, :T]


def test_the_module_stage_exports_the_given_biLM(module_run):
    root, state = module_run
    assert state["bilm"]["path"] == str(TF1) and state["bilm"]["kind"] == "tf1_hub"
    assert state["card"] is None and state["curve"] is None and any("No options file" in n for n in state["notes"])
    assert state["folder"] == str(root / "run" / "bilms" / "en")  # converted: what the adaptation starts from
    assert sorted(os.listdir(state["folder"])) == ["options.json", "weights.hdf5"]
    # The module gives the original TF1 module's layers, and ELMo with its trained mix.
    layers, ref, mask = module_layers(state["module"])
    for k in range(3):
        np.testing.assert_allclose(layers[:, k][mask], ref["lm_embeddings"][:, k][mask], atol=1e-5, err_msg=f"layer {k}")
    np.testing.assert_allclose(ref["elmo_ours"][mask], ref["elmo"][mask], atol=1e-5)


REVIEWS = ["the film was great and the acting was great .", "a dull film with a dull plot .",
           "great acting but the plot was dull .", "the plot of the film was great ."]


def test_adaptation_starts_from_the_given_biLM_with_a_fresh_softmax(module_run, tmp_path, monkeypatch):
    """Stage adapt_en_movie on a toy task, from the folder the module stage converted the TF1 module into: it has no
    softmax and no vocab.txt, so the run builds its vocabulary from the task's texts and starts a fresh softmax; at a
    learning rate of 1e-30 the biLM keeps the given weights exactly (not the initialisers')."""
    root, state = module_run
    train_on_one_device(monkeypatch)
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    for split, n in (("train", 40), ("dev", 8)):
        (task_dir / f"{split}.tsv").write_text("label\ttext\n" + "".join(f"{i % 2}\t{REVIEWS[i % 4]}\n" for i in range(n)))
    monkeypatch.setitem(stages.TASKS, "en_movie", {"lang": "en", "dir": str(task_dir)})
    settings = types.SimpleNamespace(run_dir=str(tmp_path / "run"), adapt_steps=1, lm_max_minutes=10.0, adapt_eval_every=1,
                                     seed=0, adapt_learning_rate=1e-30)
    summary = stages.Pipeline(settings).adapt("en_movie", state)
    assert summary["complete"] and summary["dev_before"] is None and np.isfinite(summary["dev_after"]["perplexity"])
    assert summary["bilm"] == state["bilm"] and summary["training"] == stages.ADAPT_TRAINING
    save_dir = tmp_path / "run" / "adapt" / "en_movie" / "lm"
    words = (save_dir / "vocab.txt").read_text().split()
    assert sorted(words[3:]) == sorted({w for r in REVIEWS for w in r.split()})  # <S>, </S>, <UNK>, then the task's
    options = json.loads((save_dir / "options.json").read_text())
    # The adaptation's training fields, whatever the biLM's options say (its negatives: at most the vocabulary's size).
    assert {k: options[k] for k in stages.ADAPT_TRAINING} == dict(stages.ADAPT_TRAINING, n_negative_samples_batch=len(words))
    # The adapted biLM is the given one (the original TF1 module's layers); (j)'s is not.
    layers, ref, mask = module_layers(summary["module_adapted"])
    sentence, token = mask.nonzero()  # the real tokens
    np.testing.assert_allclose(layers[sentence, :, token], ref["lm_embeddings"][sentence, :, token], atol=1e-5)
    random, _, _ = module_layers(summary["module_random"])
    assert np.abs(random[sentence, 1:, token] - ref["lm_embeddings"][sentence, 1:, token]).max() > 1e-2

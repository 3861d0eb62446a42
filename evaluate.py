"""Shows what elmo_tf's embeddings buy, the paper's way: the published biLMs (or any others), domain adaptation, a task
model with and without ELMo on two sentiment tasks, learning curves, pictures; writes docs/RESULTS.md.

    python evaluate.py            # the default run, from the published biLMs (`bash evaluate.sh` sets up the venv)
    python evaluate.py --bilm_en=elmo_5.5B --run_dir=runs/eval_5.5B --docs_dir=/tmp/docs_5.5B   # another English biLM
    python evaluate.py --stages=corpus_en,corpus_zh,lm_en,lm_zh      # how the published biLMs were made (about 2 h)
    python evaluate.py --sizes=32,64 --seeds=0,1 --adapt_steps=20 --tm_max_steps=20 --dev_examples=64 \
        --run_dir=/tmp/tiny --docs_dir=/tmp/tiny_docs      # a quick smoke run

The stages and what each makes: evaluation/stages.py; each finished stage in --run_dir is reused when the command
is run again (--redo=STAGE repeats one).
"""

from __future__ import annotations

import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402

from elmo_tf.utils import flag_checks  # noqa: E402  (absl only: a bad flag is reported before TensorFlow loads)

_OTHER_FLAGS = set(flags.FLAGS)  # absl's own (--verbosity, ...); the pipeline's settings are the flags defined next
from evaluation import settings_flags  # noqa: E402  (the pipeline's settings, one flag each)

flags.adopt_module_key_flags(settings_flags)  # --help lists them

FLAGS = flags.FLAGS


def refuse(message: str) -> None:
    """A command that cannot run as written: the reason on one line (not the whole help), exit status 2."""
    sys.stderr.write(f"evaluate.py: {message}\n")
    sys.exit(flag_checks.EXIT_USAGE)


def main(argv):
    if len(argv) > 1:
        refuse(f"Unexpected arguments: {argv[1:]}")
    from evaluation import run_settings, stages  # (numeric flags were checked when absl parsed them: flag_checks)
    from elmo_tf.errors import InputError

    settings = types.SimpleNamespace(**{name: FLAGS[name].value for name in set(FLAGS) - _OTHER_FLAGS},
                                     command="python evaluate.py " + " ".join(sys.argv[1:]))
    problem = run_settings.usage_problem(settings)  # (a biLM that cannot be used is refused here, before any work)
    if problem:
        refuse(problem)
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines about saving; progress is printed
    try:
        stages.run(settings)
    except (LookupError, InputError) as e:  # a stage needs one that has not run; a biLM's files cannot be read
        refuse(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=flag_checks.parse_flags)

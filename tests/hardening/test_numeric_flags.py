"""Out-of-range numeric flags of every command line: 0 where 0 is invalid, negatives, too large values, nan/inf.

What a user must see: absl's message naming the flag and its allowed range ("flag --port=70000: 70000 is not an
integer in the range [0, 65535]"), exit status 2, no traceback, and nothing done (the values are refused while
the flags are parsed, before a model or a file is touched). The ranges are declared once, on the flag
definitions (absl's lower_bound/upper_bound, elmo_tf/utils/flag_checks.py for floats and lists of numbers).

Every case of every command is parsed in ONE child process (numeric_flags_child.py: one TensorFlow import) by
the flags_parser the command hands to app.run; a few true command lines, run at the same time, show the exit
status and the output of the real thing.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from tests.hardening.conftest import REPO, run_child

POSITIVE = "an integer in the range [1, 2147483647]"
SLOW_FIXTURES = {"children"}  # every command started as a child process: their tests are slow (conftest.py)
NON_NEGATIVE = "an integer in the range [0, 2147483647]"
SEED = "an integer in the range [0, 4294967295]"
SIZE_BAD = ["0", "-1", str(2**31)]  # 2**31: past int32, the type of TensorFlow's shapes and sizes
FINITE = "a finite number"

# command -> (entry point, {flag: (allowed range as the message words it, bad values)}, accepted boundary values)
COMMANDS = {
    "train": (("path", "train.py"), {
        **{name: (POSITIVE, SIZE_BAD) for name in ("batch_size", "unroll_steps", "n_negative_samples", "max_steps",
                                                   "n_epochs", "min_count", "checkpoint_every", "keep_checkpoints")},
        "health_lines": (NON_NEGATIVE, ["-1", str(2**31)]),
        "health_every": (POSITIVE, ["0", str(2**31)]),
        "state_reset_prob": ("a number in the range [0, 1]", ["-0.01", "1.5", "nan", "inf"]),
        "health_max_ratio": ("a finite number >= 1", ["0.5", "-1", "inf", "nan"]),
        "vocab_size": ("an integer in the range [3, 2147483647]", ["2", "0", "-5", str(2**31)]),
        "eval_every": (NON_NEGATIVE, ["-1", str(2**31)]),
        "seed": (SEED, ["-1", str(2**32)]),
        "num_gpus": ("a non-negative integer", ["-1"]),  # more than are visible: a one-line error once TF has started
        "learning_rate": ("a finite number > 0", ["0", "-0.1", "inf", "nan"]),
        "dropout": ("a number in the range [0, 1)", ["-0.1", "1", "1.5", "nan"]),
    }, [[], ["--seed=4294967295", "--eval_every=0", "--dropout=0", "--num_gpus=0", "--vocab_size=3", "--batch_size=1",
             "--learning_rate=1e-9", "--state_reset_prob=0", "--state_reset_prob=1", "--health_max_ratio=1",
             "--health_lines=0", "--keep_checkpoints=1"]]),
    "export": (("path", "export.py"), {
        "version": ("an integer in the range [1, 9223372036854775807]", ["0", "-1", str(2**63)]),
        "l2_coef": ("a finite number >= 0", ["-0.5", "inf", "nan"]),
        "mix_weights": (FINITE, ["1,x,2", "1,nan,2", "1,inf,0"]),
        "checkpoint_step": ("an integer in the range [0, 9223372036854775807]", ["-1", str(2**63)]),
    }, [[], ["--l2_coef=0", "--mix_weights=-1,0,2.5", "--version=1", "--checkpoint_step=0"]]),
    "embed": (("module", "elmo_tf.embed"), {
        **{name: (POSITIVE, SIZE_BAD) for name in ("batch_size", "max_batch_tokens", "chunk_lines")},
        "gamma": (FINITE, ["nan", "inf", "-inf"]),
        "mix_weights": (FINITE, ["1,x,2", "1,nan,2"]),
    }, [[], ["--gamma=-2", "--gamma=0", "--mix_weights=1,-2,3", "--batch_size=1", "--chunk_lines=2147483647"]]),
    "embed_beam": (("module", "elmo_tf.embed_beam"), {
        **{name: (POSITIVE, SIZE_BAD) for name in ("batch_size", "chunk_lines", "max_line_bytes", "max_tokens")},
        "gamma": (FINITE, ["nan", "inf"]),
        "mix_weights": (FINITE, ["1,x,2", "1,-inf,2"]),
    }, [[], ["--gamma=0.5", "--mix_weights=0,0,0", "--max_tokens=1", "--runner=DirectRunner"]]),
    "records_to_hdf5": (("module", "elmo_tf.records_to_hdf5"), {}, [[]]),
    "serve": (("module", "elmo_tf.serve"), {
        **{name: ("an integer in the range [-1, 65535]", ["-2", "70000"]) for name in ("port", "rest_api_port")},
        **{name: (POSITIVE, SIZE_BAD) for name in ("max_batch_size", "max_enqueued_batches", "max_request_bytes",
                                                   "max_batch_tokens")},
        "batch_timeout_ms": ("a number in the range [0, 60000]", ["-1", "60001", "inf", "nan"]),
        # TF Serving's flag is an int32 and every value means something (0: read once, negative: never poll).
        "file_system_poll_wait_seconds": ("an integer in the range [-2147483648, 2147483647]",
                                          [str(2**31), str(-2**31 - 1)]),
        "rest_api_timeout_in_ms": (NON_NEGATIVE, ["-1", str(2**31)]),
        **{name: ("an integer in the range [0, 65536]", ["-1", "65537"]) for name in ("rest_api_num_threads",
                                                                                    "grpc_max_threads",
                                                                                    "tensorflow_intra_op_parallelism",
                                                                                    "tensorflow_inter_op_parallelism")},
        "rest_api_max_connections": ("an integer in the range [1, 1000000]", ["0", "-1", "1000001"]),
        "rest_api_read_timeout_s": ("a number in the range (0, 3600]", ["0", "-1", "3601", "inf", "nan"]),
        "rest_api_idle_timeout_s": ("a number in the range (0, 86400]", ["0", "-0.5", "86401", "inf", "nan"]),
    }, [["--model_dir=m"], ["--model_dir=m", "--port=0", "--rest_api_port=-1", "--batch_timeout_ms=0", "--rest_api_timeout_in_ms=0",
                            "--rest_api_num_threads=0", "--rest_api_max_connections=1"],
        ["--model_dir=m", "--port=-1", "--rest_api_port=65535", "--grpc_max_threads=65536", "--batch_timeout_ms=60000",
         "--tensorflow_intra_op_parallelism=65536", "--tensorflow_inter_op_parallelism=1",
         "--max_batch_size=1",
         "--rest_api_num_threads=65536", "--rest_api_max_connections=1000000", "--rest_api_read_timeout_s=3600",
         "--rest_api_idle_timeout_s=0.001"],
        ["--model_base_path=m", "--file_system_poll_wait_seconds=-2147483648"],
        ["--model_config_file=m.config", "--file_system_poll_wait_seconds=2147483647"],
        ["--model_dir=m", "--file_system_poll_wait_seconds=0"]]),
    "evaluate_classifier": (("module", "elmo_tf.evaluate_classifier"), {
        "batch_size": (POSITIVE, SIZE_BAD),
    }, [[], ["--batch_size=1"]]),
    "evaluate": (("path", "evaluate.py"), {
        **{name: (POSITIVE, SIZE_BAD) for name in ("lm_steps_en", "lm_steps_zh", "eval_every", "heldout_sentences",
                                                   "w2v_dim", "w2v_epochs", "max_tokens_en", "max_tokens_zh",
                                                   "batch_size", "hidden", "head_epochs", "min_head_steps", "max_head_steps",
                                                   "ft_epochs", "adapt_eval_every", "tm_hidden", "tm_dense",
                                                   "tm_epochs", "tm_min_steps", "tm_max_steps")},
        "dev_examples": (NON_NEGATIVE, ["-1", str(2**31)]),
        "adapt_steps": (NON_NEGATIVE, ["-1", str(2**31)]),
        "adapt_learning_rate": ("a finite number > 0", ["0", "-1", "inf", "nan"]),
        "tm_dropout": ("a number in the range [0, 1)", ["-0.5", "1"]),
        "tm_elmo_dropout": ("a number in the range [0, 1)", ["-0.5", "1"]),
        "tm_mix_l2": ("a finite number >= 0", ["-0.001", "inf", "nan"]),
        "tm_learning_rate": ("a number in the range (0, 1)", ["0", "1"]),
        "classifier_workers": ("an integer in the range [1, 8]", ["0", "9"]),
        "lm_zero_state_extra_steps": (NON_NEGATIVE, ["-1", str(2**31)]),
        "lm_zero_state_ratio": ("a finite number >= 1", ["0.5", "-1", "inf", "nan"]),
        "seed": (SEED, ["-1", str(2**32)]),
        "seeds": (SEED, ["-1", "0,x", "0,4294967296", ""]),
        "ft_seeds": (SEED, ["-1", "0,x", "0,4294967296"]),
        "sizes": (NON_NEGATIVE, ["-1", "100,x", "100,2147483648", ""]),
        "ft_sizes": (NON_NEGATIVE, ["-1", "100,1.5"]),
        "lm_max_minutes": ("a finite number > 0", ["0", "-1", "inf"]),
        "dropout": ("a number in the range [0, 1)", ["-0.5", "1", "2"]),
        "head_learning_rate": ("a number in the range (0, 1)", ["0", "-1e-3", "1", "2"]),
        "ft_learning_rates": ("a number in the range (0, 1)", ["0", "1e-4,1", "5e-4,x", ""]),
    }, [[], ["--sizes=0,2147483647", "--ft_sizes=", "--ft_seeds=", "--dev_examples=0", "--seeds=0,4294967295",
             "--ft_learning_rates=0.9", "--dropout=0", "--lm_max_minutes=0.01", "--adapt_steps=0", "--tm_mix_l2=0",
             "--tm_elmo_dropout=0", "--classifier_workers=8"]]),
}
# Flags holding lists of numbers (absl has no type for them; the others are found by their parser).
NUMBER_LISTS = {"export": {"mix_weights"}, "embed": {"mix_weights"}, "embed_beam": {"mix_weights"},
                "evaluate": {"seeds", "ft_learning_rates", "sizes", "ft_sizes", "ft_seeds"}}

BAD = [(command, flag, value) for command, (_, table, _) in COMMANDS.items() for flag, (_, values) in table.items()
       for value in values]


# True command lines (the real app.run, exit status, output), run while the child parses: serve imports TensorFlow
# before parsing (the elmo_tf package does), evaluate.py does not. train.py and elmo_tf.embed are run the same way by
# tests/training/test_train_cli.py and test_bad_input_cli.py.
END_TO_END = {
    "serve-port": (["-m", "elmo_tf.serve", "--model_dir=/nonexistent", "--port=70000"],
                   "flag --port=70000: 70000 is not an integer in the range [-1, 65535]"),
    "evaluate-rates": (["evaluate.py", "--ft_learning_rates=1e-4,1.5"],
                       "flag --ft_learning_rates=['1e-4', '1.5']: the item '1.5' is not a number in the range (0, 1)"),
}


@pytest.fixture(scope="module")
def children():
    """Starts the parsing child and the END_TO_END command lines together; returns their futures."""
    spec = {}
    for command, (entry, table, accepted) in COMMANDS.items():
        bad = [[f"--{flag}={value}"] for flag, (_, values) in table.items() for value in values]
        base = ["--model_dir=m"] if command == "serve" else []
        spec[command] = {"entry": list(entry), "argvs": [base + argv for argv in bad] + accepted}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1 + len(END_TO_END)) as pool:
        parsing = pool.submit(subprocess.run, [sys.executable, "-m", "tests.hardening.numeric_flags_child"],
                              input=json.dumps(spec), cwd=str(REPO), env=env, capture_output=True, text=True,
                              timeout=600)
        lines = {name: pool.submit(run_child, args, timeout=300) for name, (args, _) in END_TO_END.items()}
        yield parsing, lines


@pytest.fixture(scope="module")
def parsed(children) -> dict:
    """{command: {"numeric_flags": [...], "bad": {(flag, value): result}, "accepted": [result, ...]}}."""
    child = children[0].result()
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout)
    result = {}
    for command, (_, table, accepted) in COMMANDS.items():
        results = out[command]["results"]
        keys = [(flag, value) for flag, (_, values) in table.items() for value in values]
        result[command] = dict(numeric_flags=out[command]["numeric_flags"], bad=dict(zip(keys, results)),
                               accepted=results[len(keys):])
    return result


@pytest.mark.parametrize("command, flag, value", BAD, ids=[f"{c}--{f}={v}" for c, f, v in BAD])
def test_out_of_range_value_is_a_usage_error(parsed, command, flag, value):
    result = parsed[command]["bad"][(flag, value)]
    allowed = COMMANDS[command][1][flag][0]
    assert result["code"] == 2, result
    assert "Traceback" not in result["stderr"], result["stderr"]
    line = result["stderr"].splitlines()[0]
    assert line.startswith(f"FATAL Flags parsing error: flag --{flag}="), result["stderr"]
    assert allowed in line, (allowed, line)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_numeric_flag_has_cases_and_boundaries_are_accepted(parsed, command):
    table = COMMANDS[command][1]
    assert set(parsed[command]["numeric_flags"]) | NUMBER_LISTS.get(command, set()) == set(table)
    for result in parsed[command]["accepted"]:
        assert result["code"] is None, result  # parsed, nothing refused


@pytest.mark.parametrize("name", list(END_TO_END))
def test_command_line_exits_2_with_the_message(children, name):
    result = children[1][name].result()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert END_TO_END[name][1] in result.stderr, result.stderr[-3000:]
    assert result.stdout == ""

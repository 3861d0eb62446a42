"""The range checks of the commands' numeric flags, one implementation for every command.

Integer flags carry absl's own `lower_bound=` / `upper_bound=` (absl checks them while it parses the command
line and its message names the flag and the range: "flag --batch_size=0: 0 is not a positive integer").
absl's float bounds let `nan` and `inf` through and cannot exclude an end point, so float flags and lists of
numbers are checked by `check_float` / `check_number_list` below, validators that absl runs at the same time
with messages in the same style. `parse_flags` is the `flags_parser` of every command's `app.run`: a bad flag
is a usage error, exit status 2 (absl's own parser exits with 1), before any model or data is touched.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Optional

from absl import app, flags

EXIT_USAGE = 2
# Sizes and counts end up in TensorFlow shapes and int32 tensors; a larger value cannot work.
INT32_MAX = 2**31 - 1
# Seeds go to numpy's global generator (keras.utils.set_random_seed, RandomState): 0 <= seed < 2**32.
SEED_MAX = 2**32 - 1


def describe_range(low: Optional[float], high: Optional[float], low_open: bool = False, high_open: bool = False) -> str:
    """"a number in the range (0, 1)", "a finite number >= 0", "a finite number"."""
    if low is not None and high is not None:
        return f"a number in the range {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"a finite number {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"a finite number {'<' if high_open else '<='} {high:g}"
    return "a finite number"


def _in_range(value: float, low, high, low_open: bool, high_open: bool) -> bool:
    if not math.isfinite(value):
        return False
    if low is not None and (value <= low if low_open else value < low):
        return False
    return high is None or (value < high if high_open else value <= high)


def check_float(name: str, low: Optional[float] = None, high: Optional[float] = None, *, low_open: bool = False,
                high_open: bool = False, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Makes absl refuse values of the float flag `name` outside the range (and nan, inf) at parse time."""
    wanted = describe_range(low, high, low_open, high_open)

    def checker(value) -> bool:
        if value is not None and not _in_range(value, low, high, low_open, high_open):
            raise flags.ValidationError(f"{value} is not {wanted}")
        return True

    flags.register_validator(name, checker, flag_values=flag_values)


def check_number_list(name: str, low: Optional[float] = None, high: Optional[float] = None, *, low_open: bool = False,
                      high_open: bool = False, integer: bool = False, min_length: int = 0,
                      flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Makes absl refuse a list flag (DEFINE_list) whose items are not numbers in the range at parse time."""
    if integer:
        wanted = (f"an integer in the range [{low}, {high}]" if low is not None and high is not None
                  else f"an integer >= {low}" if low is not None else "an integer")
    else:
        wanted = describe_range(low, high, low_open, high_open)

    def checker(items) -> bool:
        if items is None:
            return True
        if len(items) < min_length:
            raise flags.ValidationError(f"needs at least {min_length} comma-separated value(s), each {wanted}")
        for item in items:
            try:
                value = int(item) if integer else float(item)
            except ValueError:
                value = None
            if value is None or not _in_range(value, low, high, low_open, high_open):
                raise flags.ValidationError(f"the item {item!r} is not {wanted}")
        return True

    flags.register_validator(name, checker, flag_values=flag_values)


def exit_on_flag_error(parse: Callable[[list[str]], list[str]]) -> Callable[[list[str]], list[str]]:
    """A `flags_parser` for app.run: `parse`, and on a bad flag absl's message and exit status 2."""

    def parser(argv: list[str]) -> list[str]:
        try:
            return parse(argv)
        except flags.Error as e:
            sys.stderr.write(f"FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull to see help on flags.\n")
            sys.exit(EXIT_USAGE)

    return parser


parse_flags = exit_on_flag_error(lambda argv: flags.FLAGS(argv))


def run_command(main: Callable[[list[str]], Any], flags_parser: Callable[[list[str]], list[str]] = parse_flags) -> None:
    """`app.run(main)` for a command, with `parse_flags` (exit 2 on a bad flag) and the command's own flags as the
    key flags of the program, so that `--helpshort` lists them whatever the entry point (`python -m elmo_tf.X`,
    `python train.py`, a console script): absl lists only the flags of the module it was started from."""
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith("elmo_tf.commands."):
            for flag in module_flags:
                flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main, flags_parser=flags_parser)

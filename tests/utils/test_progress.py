"""elmo_tf/utils/progress.py: what a user sees on a terminal and in a log file."""

import io

from elmo_tf.utils import progress as progress_lib
from elmo_tf.utils.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_file_gets_whole_lines_not_redraws(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(progress_lib, "LOG_INTERVAL", 0.0)  # a line on every update
    with Progress(10, done=2, stream=log) as bar:
        for done in range(3, 11):
            bar.update(done, tokens=1000 * done)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == len(set(lines)) >= 2
    assert lines[0].startswith("2/10 [") and lines[-1].startswith("10/10 [====") and " 100% | " in lines[-1]
    assert " sent/s | " in lines[-1] and "k tok/s | ETA " in lines[-1]


def test_a_terminal_gets_one_line_redrawn_in_place():
    tty = Terminal()
    with Progress(3, label="encoding", stream=tty) as bar:
        for done in (1, 2, 3):
            bar.update(done, loss=0.5)
    text = tty.getvalue()
    assert text.startswith("\rencoding: 0/3") and text.endswith("\n") and text.count("\n") == 1
    assert "encoding: 3/3 [" in text and "| loss 0.5 | ETA" in text


def test_unknown_total_has_no_bar():
    log = io.StringIO()
    with Progress(None, label="training", unit="step", stream=log) as bar:
        bar.update(5, tokens=100, ppl=23.1)
    last = log.getvalue().splitlines()[-1]
    assert last.startswith("training: 5 | ") and "step/s" in last and "ppl 23.1" in last and "[" not in last


def test_a_line_written_beside_a_terminal_bar_gets_a_line_of_its_own():
    tty = Terminal()
    with Progress(3, label="training", stream=tty) as bar:
        bar.update(1)
        progress_lib.write("Estimated time: about 17 days", tty)
        bar.update(3)
    lines = tty.getvalue().split("\n")
    assert "Estimated time: about 17 days" in [line.split("\r")[-1] for line in lines]
    assert "training: 3/3 [" in lines[-2]  # the bar is drawn again below the line

"""How many tokens a raw text can have, before tokenizing it: for batching by length outside the graph."""

from __future__ import annotations

import re
from typing import Union

# CJK ideographs (Han script and its punctuation-like marks), a superset of what the `cjk_chars` tokenizer
# (elmo_tf/text/char_ids.py) splits off as tokens of their own.
_CJK_IDEOGRAPH = re.compile(
    "[\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\U00020000-\U0003134f]"
)


def max_tokens(text: Union[str, bytes]) -> int:
    """An upper bound of the tokens of a text under either in-graph tokenizer: its whitespace-separated pieces
    (exactly what `whitespace` finds) plus its CJK ideographs (each a token of its own with `cjk_chars`)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return len(text.split()) + len(_CJK_IDEOGRAPH.findall(text))

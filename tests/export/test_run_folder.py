"""`export_run` (elmo_tf/export/run_folder.py): the arguments it refuses before touching the run. Its exports are
checked through its two callers: `export.py --checkpoint_dir` (tests/training/test_train_cli.py, test_health.py) and
`evaluation/publish.py` (tests/evaluation/test_publish.py)."""

import pytest

import elmo_tf
from elmo_tf.errors import ExportError
from elmo_tf.export.hub import ExportOptions
from elmo_tf.export.run_folder import export_run


@pytest.mark.parametrize("kwargs, message", [
    (dict(format="onnx"), r"`format` must be one of \['saved_model', 'hdf5'\]; received 'onnx'"),
    (dict(format="hdf5", export_options=ExportOptions()), "`export_options` apply to format='saved_model' only"),
    (dict(softmax_dtype="float16"), "`softmax_dtype` applies to format='hdf5' only; received 'float16'"),
])
def test_refuses_arguments_of_the_other_format(kwargs, message, tmp_path):
    with pytest.raises(ExportError, match=message):
        export_run(str(tmp_path / "no_run"), str(tmp_path / "out"), **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_refuses_a_target_that_is_not_an_export_before_reading_the_run(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an earlier export; refusing to replace it"):
        export_run(str(tmp_path / "no_run"), str(tmp_path / "out"))  # no run there: the target is checked first


def test_is_a_public_name():
    assert elmo_tf.export_run is export_run

"""The checks a Beam embedding job (`python -m elmo_tf.embed_beam`) passes before it starts.

Everything here is cheap and runs on the launching machine: unknown pipeline options, the input files, the
module folder and its layer count, the output folder, and an output prefix already holding another run.
Each failure is an EmbedError that names what was wrong and what was expected.
"""

from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from elmo_tf.embedding.beam_pipeline import EmbedSettings, input_files
from elmo_tf.embedding.records import check_prefix_settings
from elmo_tf.errors import ConfigError, EmbedError
from elmo_tf.model.config import BiLMConfig


def unknown_options(beam_args: list[str]) -> list[str]:
    """The options in `beam_args` that Beam's PipelineOptions does not know, as `--name`, sorted."""
    options = PipelineOptions(beam_args)
    unknown = set(options.get_all_options(retain_unknown_options=True)) - set(options.get_all_options())
    return sorted("--" + name for name in unknown)


def check_job(settings: EmbedSettings, beam_args: list[str]) -> list[str]:
    """Checks what can be checked before the job starts; returns the sorted input files.

    Raises:
      EmbedError: unknown options, no input file, a module folder that is not an export (or whose layer
        count does not fit the mix weights), a missing local output folder, or an output prefix that holds
        a run with other settings.
    """
    unknown = unknown_options(beam_args)
    if unknown:
        raise EmbedError(
            f"Unknown option(s) {unknown}: neither an embed_beam flag (see --help) nor a Beam pipeline option.")
    files = input_files(settings.input_pattern)
    if not files:
        raise EmbedError(f"--input_pattern={settings.input_pattern!r} matches no file.")
    module = settings.module.rstrip("/")
    if not FileSystems.exists(module + "/saved_model.pb"):
        raise EmbedError(f"--module={settings.module!r} is not an exported module (no saved_model.pb in it).")
    try:
        with FileSystems.open(module + "/assets/options.json") as f:
            config = BiLMConfig.from_json_string(f.read().decode("utf-8"))
    except (OSError, ConfigError, ValueError) as e:
        raise EmbedError(f"Cannot read the options of --module={settings.module!r} (assets/options.json): {e}")
    if settings.mix_weights is not None and len(settings.mix_weights) != config.num_output_layers:
        raise EmbedError(f"--mix_weights needs {config.num_output_layers} values (L + 1) for this module; "
                         f"got {len(settings.mix_weights)}.")
    if FileSystems.get_scheme(settings.output_prefix) in (None, "file"):
        folder = os.path.dirname(os.path.abspath(settings.output_prefix))
        if not os.path.isdir(folder):
            raise EmbedError(f"The folder of --output_prefix does not exist: {folder!r}.")
    problem = check_prefix_settings(settings.output_prefix, settings.to_dict())
    if problem:
        raise EmbedError(f"{problem}; choose another --output_prefix (or delete those files).")
    return files

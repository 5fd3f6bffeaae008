"""Every file a user points at is read by the runtime's capped, non-blocking reader (issue
31.3): model configs, NVML recordings. A FIFO or a device is refused at once; a wrong shape is
one line naming the file and the field."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from a2a_tune.tuner.shapes import ShapeSpecError, from_model_config


def _bounded(call, seconds=20):
    got = []
    t = threading.Thread(target=lambda: got.append(call()), daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"{call} blocked"
    return got[0]


@pytest.mark.parametrize("value", ["a string", [1, 2], 7])
@pytest.mark.parametrize("key", ["text_config", "llm_config"])
def test_a_model_config_whose_language_half_is_not_an_object_is_one_line(tmp_path, key, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "m", key: value}))
    with pytest.raises(ShapeSpecError) as info:
        from_model_config(path)
    assert str(info.value) == f"{path}: {key}: expected a JSON object, got {type(value).__name__}"


def test_a_model_config_fifo_device_or_huge_integer_is_one_line(tmp_path, fifo):
    big = tmp_path / "big.json"
    big.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    for path, problem in ((fifo, "a FIFO"), ("/dev/zero", "a character device"), (big, "too many digits")):

        def read(path=path):
            try:
                from_model_config(path)
            except ShapeSpecError as exc:
                return str(exc)

        message = _bounded(read)
        assert problem in message and "\n" not in message


@pytest.mark.parametrize("content", [None, "[1, 2, 3]", '"text"', "{"])
def test_an_nvml_recording_that_is_a_fifo_an_array_or_broken_warns_and_probes_live(
    tmp_path, fifo, monkeypatch, caplog, content
):
    from a2a_tune.tuner.probe import recorded_source
    from a2a_tune.tuner.runtime.fingerprint import RECORDING_ENV

    path = fifo
    if content is not None:
        path = tmp_path / "rec.json"
        path.write_text(content)
    monkeypatch.setenv(RECORDING_ENV, str(path))
    with caplog.at_level(logging.WARNING):
        assert _bounded(recorded_source) is None
    (warning,) = [r.getMessage() for r in caplog.records if RECORDING_ENV in r.getMessage()]
    assert "cannot be replayed" in warning and "\n" not in warning


def test_dev_zero_as_an_nvml_recording_is_refused_at_once(monkeypatch):
    from a2a_tune.tuner.probe import recorded_source
    from a2a_tune.tuner.runtime.fingerprint import RECORDING_ENV

    monkeypatch.setenv(RECORDING_ENV, "/dev/zero")
    assert _bounded(recorded_source, 10) is None


def test_a_workload_with_an_integer_of_5000_digits_is_one_line(tmp_path):
    from a2a_tune.tuner.runtime.workload import WorkloadError, load_workload

    path = tmp_path / "w.json"
    path.write_text('{"1": ' + "9" * 5000 + "}")
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert str(info.value) == f"{path}: invalid JSON: an integer with too many digits"

"""Credentials never appear, wherever they sit in a database URL or connection string (issue 31.7)."""

from __future__ import annotations

import pytest
from run_cli import a2a
from stored import measurement

from a2a_tune.db import display_url, mask_secrets, open_store


@pytest.mark.parametrize(
    "text, secret",
    [
        ("postgresql://u@db.example/x?password=hunter2", "hunter2"),
        ("postgresql://u@db.example/x?sslmode=require&sslpassword=hunter2", "hunter2"),
        ("postgresql://u@db.example/x?passfile=/home/u/.secrets/pg&sslmode=require", ".secrets"),
        ("postgresql:///x?service=prod-admin", "prod-admin"),
        ("postgresql://u:hunter2@db.example/x", "hunter2"),
        ("connection failed: host=db user=u password='hunter 2' dbname=x", "hunter"),
        ("postgresql://u@[::1:5432/x?PASSWORD=hunter2", "hunter2"),  # does not parse
    ],
)
def test_every_place_a_url_holds_a_secret_is_masked(text, secret):
    assert secret not in mask_secrets(text)
    if "://" in text:
        assert secret not in display_url(text)
    assert "***" in mask_secrets(text)


def test_mask_leaves_what_is_not_a_secret():
    assert mask_secrets("sqlite:///runs.db") == "sqlite:///runs.db"
    assert mask_secrets("postgresql://u@h/x?sslmode=require") == "postgresql://u@h/x?sslmode=require"


def test_a_password_in_the_query_is_never_printed():
    r = a2a("show", "--db", "postgresql://u@[::1:5432/x?password=hunter2")
    assert r.returncode != 0 and "hunter2" not in r.stdout + r.stderr, r.stderr


def test_show_masks_a_stored_command_that_holds_a_secret(tmp_path):
    db = tmp_path / "s.db"
    argv = ["sweep", "--db", "postgresql://u@h/x?password=hunter2"]
    with open_store(str(db)) as s:
        hw = s.get_or_create_hardware("test.fixture.node1", "abc", {})
        rid = s.start_run(
            hw, device_type="cpu", world_size=2, versions={}, git_sha=None, config={"argv": argv}, config_hash="h"
        )
        s.add_measurement(rid, measurement())
        s.finish_run(rid, "completed")
    r = a2a("show", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout and "password=***" in r.stdout

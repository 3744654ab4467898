"""API keys at rest: encrypted in the database, plain-text rows from before still readable and
encrypted by the data migration, key rotation, and the settings' refusal to start without an
encryption key when DEBUG is off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from searches import crypto
from searches.agent import step
from searches.models import Idea, Search
from tests.web.agent_helpers import llm_search

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-live-never-show-me-123456"


def _raw_key(search: Search) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT llm_api_key FROM searches_search WHERE id = %s", [search.pk])
        return cursor.fetchone()[0]


def _store_raw(search: Search, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE searches_search SET llm_api_key = %s WHERE id = %s", [value, search.pk]
        )


@pytest.mark.django_db
def test_a_stored_key_is_encrypted_and_read_back(engineer, llm_server):
    search = llm_search(engineer, llm_api_key=KEY)
    raw = _raw_key(search)
    assert raw.startswith("fernet:") and KEY not in raw
    assert step.endpoint_for(Search.objects.get(pk=search.pk)).api_key == KEY


@pytest.mark.django_db
def test_a_key_stored_in_plain_text_before_is_still_used(engineer, llm_server):
    search = llm_search(engineer)
    _store_raw(search, KEY)  # as the code before encryption saved it
    assert step.endpoint_for(Search.objects.get(pk=search.pk)).api_key == KEY


@pytest.mark.django_db(transaction=True)
def test_the_data_migration_encrypts_plain_text_keys_and_back(engineer, llm_server):
    search = llm_search(engineer)
    call_command("migrate", "searches", "0005", verbosity=0)  # back before the data migration
    try:
        _store_raw(search, KEY)
        call_command("migrate", "searches", verbosity=0)
        raw = _raw_key(search)
        assert raw.startswith("fernet:") and crypto.decrypt(raw) == KEY
        call_command("migrate", "searches", "0005", verbosity=0)
        assert _raw_key(search) == KEY  # what the older code reads
    finally:
        call_command("migrate", "searches", verbosity=0)
    assert crypto.decrypt(_raw_key(search)) == KEY


@pytest.mark.django_db
def test_rotation_reencrypts_every_key_under_the_new_first_key(engineer, llm_server, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.AUTOWEB_ENCRYPTION_KEYS = [old]
    search = llm_search(engineer, llm_api_key=KEY)
    legacy = llm_search(engineer)
    _store_raw(legacy, "plain-key-from-before-77")
    settings.AUTOWEB_ENCRYPTION_KEYS = [new, old]  # step 1: the new key first, the old kept
    assert step.endpoint_for(Search.objects.get(pk=search.pk)).api_key == KEY
    call_command("rotate_llm_keys", verbosity=0)
    settings.AUTOWEB_ENCRYPTION_KEYS = [new]  # step 3: the old key removed
    assert step.endpoint_for(Search.objects.get(pk=search.pk)).api_key == KEY
    assert crypto.decrypt(_raw_key(legacy)) == "plain-key-from-before-77"
    assert crypto.is_encrypted(_raw_key(legacy))
    idea = Idea.objects.get(pk=search.idea_id)
    assert crypto.decrypt(idea.llm_api_key) == KEY  # the idea's copy was rotated too


@pytest.mark.django_db
def test_a_key_no_encryption_key_opens_stops_its_search_with_a_clear_message(
    engineer, llm_server, settings
):
    search = llm_search(engineer, llm_api_key=KEY)
    settings.AUTOWEB_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # the old key lost
    with pytest.raises(
        CommandError, match=r"2 stored key\(s\) could not be decrypted.*: search \d+, idea \d+"
    ):
        call_command("rotate_llm_keys", verbosity=0)
    queued: list = []
    step.fill(Search.objects.get(pk=search.pk), "interpret", capacity=1, enqueue=queued.append)
    search.refresh_from_db()
    assert queued == [] and search.status == Search.Status.FAILED
    assert "cannot be decrypted with AUTOWEB_ENCRYPTION_KEYS" in search.stop_reason
    assert KEY not in search.stop_reason and llm_server.requests == []


def _settings_process(**env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "AUTOWEB_ENCRYPTION_KEYS"}
    }
    code = "import django; django.setup(); from django.conf import settings; "
    code += "print(len(settings.AUTOWEB_ENCRYPTION_KEYS))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "autoweb.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_an_encryption_key_production_settings_refuse_to_start():
    result = _settings_process(DEBUG="0", SECRET_KEY="s3cret-for-the-test")
    assert result.returncode != 0
    assert "AUTOWEB_ENCRYPTION_KEYS must be set when DEBUG is off" in result.stderr
    assert "Fernet.generate_key()" in result.stderr  # how to make one


def test_a_bad_encryption_key_stops_the_process_without_showing_it():
    good = Fernet.generate_key().decode()
    result = _settings_process(AUTOWEB_ENCRYPTION_KEYS=f"{good},not-a-fernet-key-xyz")
    assert result.returncode != 0
    assert "key 2 of 2 is not a Fernet key" in result.stderr
    assert "not-a-fernet-key-xyz" not in result.stderr and good not in result.stderr


def test_with_debug_on_a_development_key_is_derived_and_production_keys_are_used():
    assert _settings_process(DEBUG="1").stdout.strip() == "1"
    keys = f"{Fernet.generate_key().decode()},{Fernet.generate_key().decode()}"
    result = _settings_process(
        DEBUG="0", SECRET_KEY="s3cret-for-the-test", AUTOWEB_ENCRYPTION_KEYS=keys
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"

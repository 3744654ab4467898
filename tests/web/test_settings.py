from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from autoweb.env import (
    envbool,
    envint,
    envlist,
    envstr,
    parse_database_url,
    parse_host_allowlist,
    parse_llm_endpoints,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw", ["1", "true", "True", "YES", "on", " 1 "])
def test_envbool_reads_true_spellings(monkeypatch, raw):
    monkeypatch.setenv("AUTOWEB_T", raw)
    assert envbool("AUTOWEB_T", False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "OFF"])
def test_envbool_reads_false_spellings(monkeypatch, raw):
    monkeypatch.setenv("AUTOWEB_T", raw)
    assert envbool("AUTOWEB_T", True) is False


@pytest.mark.parametrize("default", [True, False])
def test_envbool_uses_the_default_when_unset_or_empty(monkeypatch, default):
    monkeypatch.delenv("AUTOWEB_T", raising=False)
    assert envbool("AUTOWEB_T", default) is default
    monkeypatch.setenv("AUTOWEB_T", "")
    assert envbool("AUTOWEB_T", default) is default


@pytest.mark.parametrize("raw", ["flase", "2", "enabled", "y e s"])
def test_envbool_rejects_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("AUTOWEB_T", raw)
    with pytest.raises(ImproperlyConfigured, match="AUTOWEB_T"):
        envbool("AUTOWEB_T", True)


def test_envint_parses_and_defaults(monkeypatch):
    monkeypatch.delenv("AUTOWEB_N", raising=False)
    assert envint("AUTOWEB_N", 300) == 300
    monkeypatch.setenv("AUTOWEB_N", " 42 ")
    assert envint("AUTOWEB_N", 300) == 42


@pytest.mark.parametrize("raw", ["5m", "3.5", "ten", "0x10"])
def test_envint_rejects_non_integers(monkeypatch, raw):
    monkeypatch.setenv("AUTOWEB_N", raw)
    with pytest.raises(ImproperlyConfigured, match="AUTOWEB_N"):
        envint("AUTOWEB_N", 300)


def test_envint_enforces_its_minimum(monkeypatch):
    monkeypatch.setenv("AUTOWEB_N", "0")
    with pytest.raises(ImproperlyConfigured, match="minimum"):
        envint("AUTOWEB_N", 300, minimum=1)
    monkeypatch.setenv("AUTOWEB_N", "1")
    assert envint("AUTOWEB_N", 300, minimum=1) == 1


def test_envstr_and_envlist(monkeypatch):
    monkeypatch.delenv("AUTOWEB_S", raising=False)
    assert envstr("AUTOWEB_S", "dflt") == "dflt"
    assert envlist("AUTOWEB_S", ["a"]) == ["a"]
    monkeypatch.setenv("AUTOWEB_S", " example.com, ,localhost ")
    assert envstr("AUTOWEB_S") == " example.com, ,localhost "
    assert envlist("AUTOWEB_S", []) == ["example.com", "localhost"]
    monkeypatch.setenv("AUTOWEB_S", "/a:/b")
    assert envlist("AUTOWEB_S", [], sep=":") == ["/a", "/b"]


def test_it_parses_a_full_postgres_url():
    db = parse_database_url(
        "postgres://alice:p%40ss@db.example:6543/autoweb?sslmode=require", Path("/srv")
    )
    assert db == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "autoweb",
        "USER": "alice",
        "PASSWORD": "p@ss",
        "HOST": "db.example",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }


def test_it_parses_the_ci_postgres_url():
    db = parse_database_url("postgresql://postgres@127.0.0.1:5432/test", Path("/srv"))
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == ("test", "postgres", "")
    assert (db["HOST"], db["PORT"]) == ("127.0.0.1", "5432")


def test_a_relative_sqlite_path_is_under_the_base_dir():
    db = parse_database_url("sqlite:///var/db.sqlite3", Path("/srv/app"))
    assert db == {"ENGINE": "django.db.backends.sqlite3", "NAME": Path("/srv/app/var/db.sqlite3")}


def test_an_absolute_sqlite_path_and_memory():
    assert parse_database_url("sqlite:////tmp/x.db", Path("/srv"))["NAME"] == Path("/tmp/x.db")
    assert parse_database_url("sqlite:///:memory:", Path("/srv"))["NAME"] == ":memory:"


@pytest.mark.parametrize(
    "url, message",
    [
        ("mysql://root@localhost/x", "not supported"),
        ("postgres://u@localhost:5432/", "names no database"),
        ("postgres://u@localhost:notaport/x", "invalid port"),
        ("sqlite://relative.db", "sqlite:///"),
        ("db.sqlite3", "no scheme"),
    ],
)
def test_it_rejects_bad_database_urls(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url(url, Path("/srv"))


def test_a_bad_database_url_error_hides_the_password():
    with pytest.raises(ImproperlyConfigured) as info:
        parse_database_url("postgres://u:hunter2@localhost:5432/", Path("/srv"))
    assert "hunter2" not in str(info.value)


@pytest.mark.django_db
def test_database_url_decides_which_database_the_tests_use():
    url = os.environ.get("DATABASE_URL", "")
    expected = "postgresql" if url.startswith(("postgres://", "postgresql://")) else "sqlite"
    assert connection.vendor == expected
    assert settings.DATABASES["default"]["ENGINE"].endswith(
        "postgresql" if expected == "postgresql" else "sqlite3"
    )


def _import_settings(**env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "AUTOWEB_ENCRYPTION_KEYS"}
    }
    return subprocess.run(
        [sys.executable, "-c", "import autoweb.settings"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_settings_refuse_to_start_without_a_secret_key_when_debug_is_off():
    result = _import_settings(DEBUG="0")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
    key = Fernet.generate_key().decode()
    result = _import_settings(
        DEBUG="0", SECRET_KEY="s3cret-for-the-test", AUTOWEB_ENCRYPTION_KEYS=key
    )
    assert result.returncode == 0, result.stderr


def test_settings_refuse_to_start_on_a_bad_value():
    result = _import_settings(AUTOWEB_SANDBOX_TIMEOUT_S="five minutes")
    assert result.returncode != 0
    assert "AUTOWEB_SANDBOX_TIMEOUT_S" in result.stderr
    result = _import_settings(AUTOWEB_PROBLEM_DIRS="/nonexistent/autoweb-problems")
    assert result.returncode != 0
    assert "/nonexistent/autoweb-problems" in result.stderr


# -- LLM endpoints -----------------------------------------------------------------------------


def test_declared_endpoints_take_their_keys_from_the_variables_named(monkeypatch):
    monkeypatch.setenv("VLLM_KEY", "vllm-key-1")
    monkeypatch.setenv("GW_KEY", "")
    parsed = parse_llm_endpoints(
        "vllm=http://vllm.internal:8001/v1 VLLM_KEY, gw=https://gw.example.com/v1 GW_KEY,"
        " ollama=http://10.0.0.9:11434/v1",
        "E",
    )
    assert parsed == {
        "vllm": {
            "base_url": "http://vllm.internal:8001/v1",
            "key_variable": "VLLM_KEY",
            "api_key": "vllm-key-1",
        },
        "gw": {"base_url": "https://gw.example.com/v1", "key_variable": "GW_KEY", "api_key": ""},
        "ollama": {"base_url": "http://10.0.0.9:11434/v1", "key_variable": "", "api_key": ""},
    }
    assert parse_llm_endpoints("", "E") == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("vllm", "entry 1 is not name=URL [KEY_VARIABLE]"),
        ("a=http://x/v1, Big Name=http://x/v1", "entry 2 is not name=URL"),
        ("a=http://x/v1 K extra", "entry 1 is not name=URL"),
        ("vllm http://u:pw@x/v1", "entry 1 is not name=URL"),
        ("default=http://x/v1", "the name 'default' is reserved"),
        ("custom=http://x/v1", "the name 'custom' is reserved"),
        ("a=http://x/v1,a=http://y/v1", "declared twice"),
        ("a=ftp://x/v1", "is not http(s)://host"),
        ("a=https://user:pw@x/v1", "carries credentials"),
        ("a=https://x/v1?key=1", "query string"),
        ("a=http://x/v1 1BAD", "is not a variable name"),
        ("a=http://x/v1 AUTOWEB_NOT_SET_ANYWHERE", "which is not set"),
    ],
)
def test_bad_declared_endpoints_stop_the_process_naming_the_problem(raw, message):
    with pytest.raises(ImproperlyConfigured, match="AUTOWEB_LLM_ENDPOINTS") as info:
        parse_llm_endpoints(raw, "AUTOWEB_LLM_ENDPOINTS")
    assert message in str(info.value)
    assert "pw" not in str(info.value)  # a password in a URL is never echoed


def test_the_custom_url_allowlist_takes_hosts_and_networks_only():
    assert parse_host_allowlist(["10.0.0.0/8", "127.0.0.1", "VLLM.internal", "::1"], "A") == [
        "10.0.0.0/8",
        "127.0.0.1",
        "vllm.internal",
        "::1",
    ]
    with pytest.raises(ImproperlyConfigured, match="'http://x' is neither a host name"):
        parse_host_allowlist(["http://x"], "A")


def test_custom_urls_are_off_unless_the_operator_turns_them_on():
    assert settings.AUTOWEB_LLM_ALLOW_CUSTOM_URL is False
    assert settings.AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST == []


def test_debug_pages_mask_the_declared_keys_and_the_encryption_keys(settings):
    from django.views.debug import SafeExceptionReporterFilter

    settings.AUTOWEB_LLM_ENDPOINTS = {
        "vllm": {"base_url": "http://x/v1", "key_variable": "VK", "api_key": "declared-key-99"}
    }
    settings.AUTOWEB_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    shown = str(SafeExceptionReporterFilter().get_safe_settings())
    assert "declared-key-99" not in shown
    assert settings.AUTOWEB_ENCRYPTION_KEYS[0] not in shown
    assert "http://x/v1" in shown  # the walk reached the setting

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from autoweb.env import envbool, envint, envlist, envstr, parse_database_url

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
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
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
    assert _import_settings(DEBUG="0", SECRET_KEY="s3cret-for-the-test").returncode == 0


def test_settings_refuse_to_start_on_a_bad_value():
    result = _import_settings(AUTOWEB_SANDBOX_TIMEOUT_S="five minutes")
    assert result.returncode != 0
    assert "AUTOWEB_SANDBOX_TIMEOUT_S" in result.stderr
    result = _import_settings(AUTOWEB_PROBLEM_DIRS="/nonexistent/autoweb-problems")
    assert result.returncode != 0
    assert "/nonexistent/autoweb-problems" in result.stderr

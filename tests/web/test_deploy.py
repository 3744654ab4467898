"""The production settings test: `check --deploy` is clean with DEBUG off, secrets come only from
the environment, and docs/deploy.md lists exactly the environment variables the code reads."""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
# Set by the sandbox for its own child, never by an operator.
INTERNAL_ENV = {
    "AUTOWEB_WIRE_FD",
    "AUTOWEB_DEVICE",
    "AUTOWEB_GPU_LOCK",
    "AUTOWEB_CONFINE_DIR",
    "AUTOWEB_DENY_SOCKETS",
    "AUTOWEB_LIMIT_AS",
    "AUTOWEB_LIMIT_FSIZE",
    "AUTOWEB_LIMIT_NOFILE",
    "PATH",
}
_OURS = {
    "DEBUG",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DATABASE_URL",
    "SECURE_SSL_REDIRECT",
    "BEHIND_TLS_PROXY",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "CSRF_TRUSTED_ORIGINS",
}


def _database_url(tmp_path: Path) -> str:
    """The suite's PostgreSQL when it runs on one, else a SQLite file of the test's own."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        return url
    return f"sqlite:///{tmp_path}/deploy.sqlite3"


def production_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OURS and not k.startswith("AUTOWEB_")}
    env.update(
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="autoweb.example.com",
        CSRF_TRUSTED_ORIGINS="https://autoweb.example.com",
        DATABASE_URL=_database_url(tmp_path),
        AUTOWEB_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def production_settings(env: dict[str, str], *names: str) -> dict:
    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "autoweb.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- check --deploy ----------------------------------------------------------------------------


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    result = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        ({"SECRET_KEY": "short"}, "security.W009"),
        ({"SECURE_HSTS_SECONDS": "0"}, "security.W004"),
        ({"SECURE_SSL_REDIRECT": "0"}, "security.W008"),
        ({"DEBUG": "1"}, "security.W018"),
        ({"ALLOWED_HOSTS": ""}, "security.W020"),
    ],
)
def test_check_deploy_fails_on_a_weakened_setting(tmp_path, overrides, warning):
    """The clean check above could not pass by accident: each weakening is caught."""
    result = manage(
        production_env(tmp_path, **overrides), "check", "--deploy", "--fail-level", "WARNING"
    )
    assert result.returncode != 0
    assert warning in result.stdout + result.stderr


def test_production_settings_turn_on_https_cookies_and_headers(tmp_path):
    values = production_settings(
        production_env(tmp_path),
        "DEBUG",
        "SECURE_SSL_REDIRECT",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_HSTS_PRELOAD",
        "SECURE_CONTENT_TYPE_NOSNIFF",
        "SECURE_REFERRER_POLICY",
        "X_FRAME_OPTIONS",
        "SECURE_PROXY_SSL_HEADER",
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
    )
    assert values == {
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "SECURE_REFERRER_POLICY": "same-origin",
        "X_FRAME_OPTIONS": "DENY",
        "SECURE_PROXY_SSL_HEADER": None,
        "ALLOWED_HOSTS": ["autoweb.example.com"],
        "CSRF_TRUSTED_ORIGINS": ["https://autoweb.example.com"],
    }


def test_behind_a_tls_proxy_the_forwarded_proto_is_trusted_and_the_redirect_switchable(tmp_path):
    env = production_env(
        tmp_path, BEHIND_TLS_PROXY="1", SECURE_SSL_REDIRECT="0", SECURE_HSTS_SECONDS="3600"
    )
    values = production_settings(
        env, "SECURE_PROXY_SSL_HEADER", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS"
    )
    assert values == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 3600,
    }


def test_production_settings_refuse_to_start_without_a_secret_key(tmp_path):
    result = manage(production_env(tmp_path, SECRET_KEY=None), "check")
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_a_bad_security_value_stops_the_process_naming_it(tmp_path):
    result = manage(production_env(tmp_path, SECURE_HSTS_SECONDS="a year"), "check")
    assert result.returncode != 0
    assert "SECURE_HSTS_SECONDS" in result.stderr


def test_a_production_page_is_served_only_over_https_with_its_headers(tmp_path):
    code = (
        "import django; django.setup(); from django.test import Client; "
        "plain = Client().get('/accounts/login/', HTTP_HOST='autoweb.example.com'); "
        "tls = Client().get('/accounts/login/', HTTP_HOST='autoweb.example.com', secure=True); "
        "print(plain.status_code, plain.get('Location')); "
        "print(tls.status_code, tls['Strict-Transport-Security'], tls['X-Frame-Options'], "
        "tls['X-Content-Type-Options'], tls['Referrer-Policy']); "
        "print(tls.cookies['csrftoken']['secure'])"
    )
    env = {**production_env(tmp_path), "DJANGO_SETTINGS_MODULE": "autoweb.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    plain, tls, cookie = result.stdout.strip().splitlines()[-3:]
    assert plain == "301 https://autoweb.example.com/accounts/login/"
    assert tls == ("200 max-age=31536000; includeSubDomains; preload DENY nosniff same-origin")
    assert cookie == "True"


# -- secrets -----------------------------------------------------------------------------------

_SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_-]{20,}"),  # OpenAI-style API keys
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key ids
    re.compile(r"(?:SECRET_KEY|API_KEY|PASSWORD)\s*=\s*['\"][^'\"]{16,}['\"]"),
]
# Literals a reader can see are not secrets: the DEBUG-only key (Django's check refuses any
# "django-insecure-" key in production), and the tests' throwaway values.
_ALLOWED = (
    "django-insecure-",
    "pw-42-long!",
    "s3cret-for-the-test",
    "sk-test-secret-key-0123456789",  # the tests' fake LLM endpoint's key
    "sk-live-never-show-me-123456",  # a test that the key is never rendered
    "sk-e2e-secret-key-000000",
)


def test_no_secret_is_committed():
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    found = []
    for name in filter(None, files):
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for pattern in _SECRET_PATTERNS:
            for match in pattern.finditer(text):
                if not any(ok in match.group(0) for ok in _ALLOWED):
                    found.append(f"{name}: {match.group(0)[:40]}")
    assert not found, found


def test_the_settings_read_secrets_only_from_the_environment():
    tree = ast.parse((ROOT / "autoweb" / "settings.py").read_text())
    assigned = {
        target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for name in ("OPENAI_API_KEY",):
        value = assigned[name]
        assert isinstance(value, ast.Call) and value.func.id == "envstr", name
        assert len(value.args) == 1, f"{name} has a default"  # no default: no literal secret


# -- docs/deploy.md lists every environment variable -------------------------------------------

_ENV_CALL = re.compile(
    r"""(?:env(?:str|bool|int|list)\(|os\.environ\.get\(|os\.getenv\(|os\.environ\[)\s*["']([A-Z][A-Z0-9_]*)["']"""
)
# Any AUTOWEB_* string literal, wherever it stands: a variable may be read through a name
# (`ENV_DIR = "AUTOWEB_LIBRARY_DIR"`, then `os.environ.get(ENV_DIR)`), which _ENV_CALL misses.
_OUR_LITERAL = re.compile(r"""["'](AUTOWEB_[A-Z0-9_]+)["']""")


def env_read_by(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        text = path.read_text()
        found |= set(_ENV_CALL.findall(text)) | set(_OUR_LITERAL.findall(text))
    return found


def documented(section: str) -> set[str]:
    """Variables in the first column of the tables under the `### section` heading."""
    text = DEPLOY_DOC.read_text()
    start = text.index(f"### {section}")
    end = text.find("\n#", start + 1)
    block = text[start : end if end != -1 else None]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", block, re.M))


def test_the_settings_section_of_deploy_md_is_exactly_what_the_settings_read():
    read = env_read_by([ROOT / "autoweb" / "settings.py"])
    assert "SECRET_KEY" in read and "SECURE_HSTS_SECONDS" in read  # the scan itself works
    assert documented("Web and orchestrator") == read


def test_every_variable_the_code_reads_is_documented_and_every_documented_one_is_read():
    code = [
        p
        for package in ("autoweb", "core", "searches", "library", "kernels")
        for p in (ROOT / package).rglob("*.py")
        if "migrations" not in p.parts
    ]
    read = env_read_by(code) - INTERNAL_ENV
    docs = documented("Web and orchestrator") | documented("GPU workers")
    assert read - docs == set(), "read by the code but not in docs/deploy.md"
    assert docs - read == set(), "in docs/deploy.md but read by no code"

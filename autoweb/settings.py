"""autoweb settings, all from environment variables (see autoweb/env.py for the parsers).

Local defaults need nothing set: DEBUG on, SQLite under var/, Redis on 127.0.0.1:6379.
A deployment sets DEBUG=0, SECRET_KEY, ALLOWED_HOSTS and usually DATABASE_URL.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from autoweb.env import (
    encryption_keys,
    envbool,
    envint,
    envlist,
    envstr,
    parse_database_url,
    parse_host_allowlist,
    parse_llm_endpoints,
    parse_prices,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

# --- core -------------------------------------------------------------------------------------

DEBUG = envbool("DEBUG", True)
SECRET_KEY = envstr("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "django-insecure-autoweb-local-development-only"
# Fernet keys for secrets stored in the database (the searches' API keys): the first encrypts,
# all decrypt (docs/deploy.md, "Encryption keys"). Required with DEBUG off.
AUTOWEB_ENCRYPTION_KEYS = encryption_keys(
    envstr("AUTOWEB_ENCRYPTION_KEYS"), "AUTOWEB_ENCRYPTION_KEYS", debug=DEBUG, secret_key=SECRET_KEY
)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

# HTTPS. With DEBUG off everything below is on, and `manage.py check --deploy` is clean; local
# development (DEBUG on, plain http) has it off. Behind a reverse proxy that terminates TLS, set
# BEHIND_TLS_PROXY=1 so that the proxy's X-Forwarded-Proto tells Django a request came over
# https (the proxy must set that header itself, overwriting any the client sent); a proxy that
# redirects http to https itself may set SECURE_SSL_REDIRECT=0.
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not DEBUG)
if envbool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
# One year by default; start lower (e.g. 3600) on a domain that has never been served over https.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves http and websockets
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "core",  # helpers both apps use; before them, so its templatetags load first
    "searches",
    "library",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.middleware.RefuseNulMiddleware",
    # Static files (htmx, plotly, css) from this server under daphne too; no CDN.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a login unless its view opts out (the login view does).
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

# Serve straight from the app's static folders in development; `collectstatic` in production.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

ROOT_URLCONF = "autoweb.urls"
WSGI_APPLICATION = "autoweb.wsgi.application"
ASGI_APPLICATION = "autoweb.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "searches:dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- database ---------------------------------------------------------------------------------

DATABASES = {
    "default": parse_database_url(envstr("DATABASE_URL", "sqlite:///var/db.sqlite3"), BASE_DIR)
}
_db_name = DATABASES["default"]["NAME"]
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The web app, the orchestrator and its tests write from several processes and threads: a
    # transaction that reads and then writes must take SQLite's write lock up front, or two of
    # them deadlock and one fails at once with "database is locked" instead of waiting.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("transaction_mode", "IMMEDIATE")
    if _db_name != ":memory:":
        Path(_db_name).parent.mkdir(parents=True, exist_ok=True)
    # A file, not memory: end-to-end tests run the orchestrator and workers as real processes
    # that must open the same test database.
    # One file per test process, so parallel test runs never share (or delete) each other's.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")}

# --- Redis / RQ -------------------------------------------------------------------------------

REDIS_URL = envstr("REDIS_URL", "redis://127.0.0.1:6379/0")
# A GPU worker counts as online while its last heartbeat is at most this many seconds old.
AUTOWEB_WORKER_ONLINE_S = envint("AUTOWEB_WORKER_ONLINE_S", 30, minimum=1)
# `manage.py up`: GPU worker processes per visible GPU. They share the GPU's timing lock, so one
# candidate is timed alone while the others compile and verify.
AUTOWEB_WORKERS_PER_GPU = envint("AUTOWEB_WORKERS_PER_GPU", 4, minimum=1)

# --- channels ---------------------------------------------------------------------------------

# What reaches the layer: per search, at most one message of rendered rows per orchestrator poll
# (POLL_S, progress coalesced per trial), plus verdicts, status changes and a few token batches a
# second; rows are rendered once for the whole group (searches/live.py). channels-redis 4 queues
# one copy of a group message per daphne *process* (all its sockets share one Redis key), then
# copies it into each socket's local buffer; `capacity` bounds both. The default of 100 is under
# a second of traffic for a process watching ~50 busy searches, so a short stall (GC, a burst of
# reconnect catch-ups on 2 cores) would drop rows: 1000 gives ~10 s of slack, a few MB at most
# (a socket's buffer shares the message objects). `expiry` 60 s: a process merely slow still gets
# every row; a dead process's queue is gone within a minute. `group_expiry` (a day, the
# default): consumers renew their entry at each access re-check, so an open page stays in.
# `socket_timeout`: a socket waits for its messages with a blocking BZPOPMIN of 5 s, and redis-py
# 8 gives every connection a 5-s read timeout by default, so each socket idle for 5 s was torn
# down with 1011 (a known channels-redis problem, reported upstream); 15 s is above the pop and
# still bounds a hung Redis.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
            "capacity": 1000,
            "expiry": 60,
            "group_expiry": 86400,
        },
    }
}

# --- LLM --------------------------------------------------------------------------------------
# Keys from the environment only, never logged or rendered. (Django's debug pages mask any
# setting, or key of a dict setting, whose name contains KEY.)

# The endpoint named "default": empty base URL is the openai client's default endpoint.
OPENAI_BASE_URL = envstr("OPENAI_BASE_URL")
OPENAI_API_KEY = envstr("OPENAI_API_KEY")
# More endpoints, each with its own key: "name=URL KEY_VARIABLE, name2=URL2 KEY_VARIABLE2". A
# server key goes only to the endpoint it is declared with.
AUTOWEB_LLM_ENDPOINTS = parse_llm_endpoints(
    envstr("AUTOWEB_LLM_ENDPOINTS"), "AUTOWEB_LLM_ENDPOINTS"
)
# Whether users may type a base URL of their own. Such a URL gets only the key typed with it,
# and must resolve to public addresses, except hosts and networks in the allowlist.
AUTOWEB_LLM_ALLOW_CUSTOM_URL = envbool("AUTOWEB_LLM_ALLOW_CUSTOM_URL", False)
AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST = parse_host_allowlist(
    envlist("AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST", []), "AUTOWEB_LLM_CUSTOM_URL_ALLOWLIST"
)
AUTOWEB_DEFAULT_MODEL = envstr("AUTOWEB_DEFAULT_MODEL")
# Models offered in the idea form (any other `llm:<model>` is accepted through the API).
AUTOWEB_LLM_MODELS = envlist("AUTOWEB_LLM_MODELS", [])
# Seconds: waiting for one streamed chunk (or the connection); one whole reply.
AUTOWEB_LLM_TIMEOUT_S = envint("AUTOWEB_LLM_TIMEOUT_S", 120, minimum=1)
AUTOWEB_LLM_MAX_REPLY_S = envint("AUTOWEB_LLM_MAX_REPLY_S", 900, minimum=1)
# How long a proposal keeps retrying an endpoint that rate-limits, errs (5xx) or times out,
# an optional cap on the attempts within it (0: none), and the first backoff (it doubles, up to
# a minute; a Retry-After header wins).
AUTOWEB_LLM_RETRY_S = envint("AUTOWEB_LLM_RETRY_S", 600, minimum=0)
AUTOWEB_LLM_ATTEMPTS = envint("AUTOWEB_LLM_ATTEMPTS", 0, minimum=0)
AUTOWEB_LLM_BACKOFF_MS = envint("AUTOWEB_LLM_BACKOFF_MS", 2000, minimum=0)
# Tokens: the assembled prompt's budget; the reply's cap.
AUTOWEB_LLM_PROMPT_TOKENS = envint("AUTOWEB_LLM_PROMPT_TOKENS", 24_000, minimum=2_000)
AUTOWEB_LLM_MAX_OUTPUT_TOKENS = envint("AUTOWEB_LLM_MAX_OUTPUT_TOKENS", 8_000, minimum=256)
# Hybrid: after an accepted LLM candidate with `# tune:` knobs, at most this many tuner trials.
AUTOWEB_LLM_TUNE_TRIALS = envint("AUTOWEB_LLM_TUNE_TRIALS", 8, minimum=0)
# Prices in USD per million tokens, "model=in:out,model2=in:out"; unpriced models cost nothing.
AUTOWEB_LLM_PRICES = parse_prices(envstr("AUTOWEB_LLM_PRICES"), "AUTOWEB_LLM_PRICES")

# --- kernels ----------------------------------------------------------------------------------
# kernels/ is Django-free and reads AUTOWEB_PROBLEM_DIRS itself (a GPU host runs it without
# Django); it is parsed here too so that a missing directory stops the web app at startup.

AUTOWEB_PROBLEM_DIRS = envlist("AUTOWEB_PROBLEM_DIRS", [], sep=os.pathsep)
for _dir in AUTOWEB_PROBLEM_DIRS:
    if not Path(_dir).expanduser().is_dir():
        raise ImproperlyConfigured(f"AUTOWEB_PROBLEM_DIRS names {_dir!r}, which is not a directory")
AUTOWEB_SANDBOX_TIMEOUT_S = envint("AUTOWEB_SANDBOX_TIMEOUT_S", 300, minimum=1)

# Django's own logging, plus: a 403 logs one line with its reason, not a traceback.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"forbidden_one_line": {"()": "autoweb.logs.ForbiddenOneLine"}},
    "loggers": {"django.request": {"filters": ["forbidden_one_line"]}},
}

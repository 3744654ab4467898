"""WSGI entry point (plain http only; the live views need asgi.py)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "autoweb.settings")
application = get_wsgi_application()

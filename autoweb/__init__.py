"""autoweb's Django project: environment-driven settings, URLs, and the ASGI/WSGI entry points."""

"""Logging filters the settings install (settings.LOGGING)."""

from __future__ import annotations

import logging


class ForbiddenOneLine(logging.Filter):
    """A 403 is an expected answer, not a fault: Django logs it with the PermissionDenied's
    traceback; this keeps one line, with the reason, instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403 and record.exc_info:
            reason = record.exc_info[1]
            line = record.getMessage()
            record.msg = f"{line}: {reason}" if str(reason) else line
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True

"""The verdict rules rank every failure category the protocol knows, and the message table
handles every message the sandboxed child and the sandbox send."""

from __future__ import annotations

import re
from pathlib import Path

from kernels.harness import childrun, sandbox, verdict
from kernels.harness.evaluation import HANDLERS
from kernels.protocol import FAILURES


def test_every_failure_category_has_one_rank_for_when_several_apply():
    assert sorted(verdict.PRIORITY) == sorted(FAILURES)
    assert len(set(verdict.PRIORITY)) == len(verdict.PRIORITY)


def test_the_message_table_handles_every_message_the_child_and_the_sandbox_send():
    text = Path(childrun.__file__).read_text()
    # Messages are sent as send(t="...") or built first as {"t": "...", ...}.
    child = set(re.findall(r'\bt="(\w+)"', text)) | set(re.findall(r'\{"t": "(\w+)"', text))
    own = set(re.findall(r'\{"t": "(\w+)"', Path(sandbox.__file__).read_text()))
    # The patterns still find what they look for (else this test would pass on nothing).
    assert {"verified", "done", "want_gpu"} <= child and {"timeout", "eof"} <= own
    # "ready" is the sandbox's start-up handshake, consumed before a run (Child.wait_ready).
    assert (child | own) - {"ready"} == set(HANDLERS)

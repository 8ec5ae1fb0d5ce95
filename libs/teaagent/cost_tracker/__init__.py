"""Cost reporting over the run logs that runs leave in the workspace.

The run log
-----------

Every run writes ``<root>/.teaagent/runs/<run_id>.jsonl`` (mode 0600, folder 0700) through
:class:`RunLogWriter`: one JSON object per line, UTF-8, each line appended whole. Three record types::

    {"type":"run_start","version":1,"run_id":"r1","label":"nightly","provider":"openai",
     "model":"gpt-4o-mini","at":"2026-06-05T12:00:00.000001Z"}
    {"type":"model_call","run_id":"r1","model":"gpt-4o-mini","input_tokens":1200,
     "output_tokens":85,"cost_cents":0.0231,"at":"2026-06-05T12:00:02.500000Z"}
    {"type":"run_end","run_id":"r1","status":"completed","at":"2026-06-05T12:00:09.000000Z"}

- ``run_id``: 1 to 64 letters, digits, ``_`` or ``-`` (:data:`RUN_ID_PATTERN`); it names the file.
- ``label``: what the run is for, ``""`` for none; ``provider``, ``model``: names as the LLM
  module spells them. A ``model_call``'s ``model`` is the model that answered, which may differ
  from the one the run started with.
- ``input_tokens``, ``output_tokens``: integers >= 0; ``cost_cents``: a finite number >= 0, in US cents.
- ``status``: a lowercase word, ``RunResult.status`` for the runner (``completed``, ``failed``,
  ``approval_denied``, ``limit_exceeded``, ``cost_exceeded``).
- ``at``: ISO 8601 with a time zone; the writer always writes UTC with microseconds and ``Z``.

A log may lack its ``run_end`` (the run is going on, or its process died); the calls it
recorded still count. Readers ignore unknown keys and unknown record types, so later versions
may add both; a change to a field's meaning bumps ``version`` (:data:`RUN_LOG_VERSION`).

The reports
-----------

:class:`CostTracker` reads every ``*.jsonl`` of the folder and groups the cost by label, by model
and by UTC day; malformed lines are skipped and counted in :attr:`CostTracker.skipped_lines`.
Each of those sums, the runner's per run and the agent service's are a :class:`Usage`.
"""

from __future__ import annotations

from teaagent.cost_tracker._format import (
    MAX_LABEL_CHARS,
    MAX_NAME_CHARS,
    MAX_RECORD_BYTES,
    MODEL_CALL,
    RECORD_TYPES,
    RUN_END,
    RUN_ID_PATTERN,
    RUN_LOG_SUFFIX,
    RUN_LOG_VERSION,
    RUN_START,
    RUNS_DIR,
    STATUS_PATTERN,
    check_run_id,
)
from teaagent.cost_tracker._tracker import CostTracker
from teaagent.cost_tracker._usage import Usage
from teaagent.cost_tracker._writer import RunLogWriter

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_NAME_CHARS",
    "MAX_RECORD_BYTES",
    "MODEL_CALL",
    "RECORD_TYPES",
    "RUNS_DIR",
    "RUN_END",
    "RUN_ID_PATTERN",
    "RUN_LOG_SUFFIX",
    "RUN_LOG_VERSION",
    "RUN_START",
    "STATUS_PATTERN",
    "CostTracker",
    "RunLogWriter",
    "Usage",
    "check_run_id",
]

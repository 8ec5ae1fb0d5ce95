"""teaagent: AI coding agents whose high-risk tool calls need N of M peers' SSH signatures.

The library is organised by module (see ARCHITECTURE.md): :mod:`teaagent.policy`,
:mod:`teaagent.tools`, :mod:`teaagent.audit`, :mod:`teaagent.budget`, :mod:`teaagent.llm`,
:mod:`teaagent.runner`, :mod:`teaagent.signing`, :mod:`teaagent.quorum`, :mod:`teaagent.config`.
Import names from those modules; this package only carries the version and the error root.
"""

from __future__ import annotations

from teaagent.errors import TeaAgentError

__all__ = ["TeaAgentError", "__version__"]

__version__ = "0.1.0"

"""What a gateway token can grant (``tokens`` says how it is signed and checked).

Apart from ``tokens`` so that building the CLI's parser, which shows these in
its help, does not import PyJWT and cryptography: every ``checkpointd``
command, a one-shot ``checkpointd capture`` too, builds the whole parser.
"""

from __future__ import annotations

DEFAULT_AUDIENCE = "checkpointd-gateway"
OPS = ("capture", "restore", "list", "fork", "prune", "admin")
DEFAULT_OPS = ("capture", "restore", "list")

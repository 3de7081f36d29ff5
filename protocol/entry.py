"""The private argv[1] values a wb program answers before any other parsing (docs/protocol.md#transport;
docs/runs.md#the-owner).

Caller and receiver, dispatch and owner all name them from here; importing this module costs nothing.
"""

REMOTE_ARGUMENT = "--wb-internal-agent-remote"  # one request on stdin, one reply on stdout
OWNER_ARGUMENT = "--wb-internal-agent-run"  # the detached owner of one run
SERVE_ARGUMENT = "--wb-internal-agent-serve"  # many requests as JSON lines, for the courier (docs/courier.md)
LAUNCHER_ARGUMENT = "--wb-internal-owner-launcher"  # starts owners as copies of itself (docs/runs.md#the-owner)

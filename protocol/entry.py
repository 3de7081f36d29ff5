"""The private argv[1] values a wb program answers before any other parsing (contract §5.1, §7.2).

Caller and receiver, dispatch and owner all name them from here; importing this module costs nothing.
"""

REMOTE_ARGUMENT = "--wb-internal-agent-remote"  # one request on stdin, one reply on stdout
OWNER_ARGUMENT = "--wb-internal-agent-run"  # the detached owner of one run

"""What this wb's receiver can do beyond one call per session: listed in the `version` reply.

One list, one place: a feature a peer must know about before using it adds its name here.
"""

SERVE = "serve"  # `wb --wb-internal-agent-serve`: JSON lines, concurrent requests (contract §16)

CAPABILITIES: list[str] = [SERVE]

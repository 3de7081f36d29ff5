"""The far side of a call: the receiver of `wb --wb-internal-agent-remote`, its serve mode, and `perform`."""

"""The far side of a call: the receiver of `wb --wb-internal-agent-remote` and its serve mode."""

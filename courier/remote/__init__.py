"""Asking another machine over SSH: the caller (client, ssh) and the receiver (serve)."""

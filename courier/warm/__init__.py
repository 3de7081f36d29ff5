"""The warm path (docs/courier.md): a per-user courier keeps the program and the SSH connections warm."""

"""The warm path (contract §16): a per-user courier keeps the program and the SSH connections warm."""

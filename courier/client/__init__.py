"""The caller's side: the one client every front uses (`client.Client`), the transports below it, and what it
does across machines (the fleet, placement, watch, follow)."""

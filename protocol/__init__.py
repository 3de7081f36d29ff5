"""The wb wire contract: names, bounds and the schema-1 documents both sides share."""

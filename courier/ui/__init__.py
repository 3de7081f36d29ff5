"""`wb ui` (docs/ui.md): the fleet on a web page, served by wb itself.

Only `wb ui` (courier/cli.py) and `wb demo --ui` import this package; it is the one place
starlette and uvicorn are imported (the ruff banned-api rules in pyproject.toml), so the
CLI's start-up and the remote entry never pay for them.
"""

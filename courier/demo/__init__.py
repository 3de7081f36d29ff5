"""Demo helpers: a scripted model server that lets the real Codex CLI run without a real model."""

from courier.demo.model_server import SCENARIOS, ModelServer, RecordedRequest, ServedResponse, TokenUsage

__all__ = ["SCENARIOS", "ModelServer", "RecordedRequest", "ServedResponse", "TokenUsage"]

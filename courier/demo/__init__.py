"""`wb demo` and its parts: a scripted model server that lets the real Codex CLI run without a real
model (`model_server`), an embedded loopback SSH server (`sshd`), a stand-in harness for when
Codex is not installed (`standin_codex`), and the demo itself (`run.run_demo`)."""

from courier.demo.model_server import SCENARIOS, ModelServer, RecordedRequest, ServedResponse, TokenUsage

__all__ = ["SCENARIOS", "ModelServer", "RecordedRequest", "ServedResponse", "TokenUsage"]

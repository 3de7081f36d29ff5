"""`version`: this machine's wb and schema versions and its capabilities (`wb machines --check` asks it)."""

from __future__ import annotations

from courier import __version__
from courier.ops.op import Op
from courier.runs.context import Context
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import Operation
from protocol.refs import check_repository


def version_op(request: RemoteRequest, response: RemoteResponse, context: Context) -> None:
    from courier.capabilities import capabilities
    from courier.runs.bwrap_probe import probe  # only here: every other operation stays without it
    from courier.runs.views import runs_of

    response.wb_version = __version__
    response.capabilities = capabilities()
    response.sandbox = probe().describe()
    runs_of(context).describe(response)  # where runs live, when not only here (a Ray head: its nodes)
    if request.placement:
        from courier.runs.admission import placement_facts

        response.placement = placement_facts(context.config, request.repository)



def _check(request: RemoteRequest) -> None:
    if request.repository:
        check_repository(request.repository)


OP = Op(
    wire=Operation("version", "none", ("placement", "repository"), check=_check),
    handler="courier.ops.version:version_op",
    cluster="head",
    fresh_environment=True,
)

"""The Starlette application: routes, each a page, a fragment, a stream or an action (docs/ui.md, "Paths").

The handlers only parse the request and pick the page; what they ask goes through
asks.py (the CLI's client), what they show comes from pages.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from courier.client.client import Client
from courier.config import Config
from courier.daemon_thread import in_thread
from courier.errors import UsageError, WbError
from courier.ui import actions, pages
from courier.ui import asks as operations
from courier.ui.asks import Scope
from courier.ui.auth import TokenGate
from courier.ui.live import Changes, follow_lines
from protocol.refs import format_reference, is_run_prefix

_STATIC = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}
_EVENT_STREAM_HEADERS = {"x-accel-buffering": "no"}


def build_app(config: Config, scope: Scope, token: str, port: int) -> TokenGate:
    client = Client(config)  # the one client the CLI uses: every call the page makes goes through it
    changes = Changes(config, list(scope.machines))
    static = {name: (resources.files("courier.ui") / "static" / name).read_bytes() for name in _STATIC}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        import asyncio

        changes.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            changes.stop()

    def html(text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status)

    def root(request: Request) -> str:
        """The session root the gate mounted the app under (courier/ui/auth.py): every link carries it."""
        return str(request.scope.get("root_path", ""))

    def not_a_run(request: Request, error: WbError) -> Response:
        home = root(request)
        return html(pages.message_page(home, "not a run", actions.cli_message(error), home + "/"), 404)

    def _filters(request: Request) -> tuple[str, str, int]:
        """?state=, ?machine= and ?page= (1 when absent or not a whole number above 0)."""
        number = request.query_params.get("page", "1")
        page_number = int(number) if number.isdigit() and 0 < len(number) <= 6 else 1
        return request.query_params.get("state", ""), request.query_params.get("machine", ""), max(1, page_number)

    async def fleet_page(request: Request) -> Response:
        view = await in_thread(lambda: operations.fleet(client, scope))
        return html(pages.fleet_page(root(request), view, *_filters(request)))

    async def fleet_fragment(request: Request) -> Response:
        view = await in_thread(lambda: operations.fleet(client, scope))
        return html(pages.fleet_fragment(root(request), view, *_filters(request)))

    async def events(request: Request) -> Response:
        return StreamingResponse(changes.stream(), media_type="text/event-stream", headers=_EVENT_STREAM_HEADERS)

    def _target(request: Request) -> tuple[str, str, str]:
        machine, run_id = operations.parse_ref(request.path_params["ref"])
        if scope.machines and machine not in scope.machines and not scope.everything:
            raise UsageError(f"wb ui shows {_scope_words(scope)}; {format_reference(machine, run_id)} is not there")
        return machine, run_id, format_reference(machine, run_id)

    async def _whole(request: Request) -> tuple[str, str, str]:
        """`_target` with a short reference (docs/cli.md#short-references) resolved to its run's whole ID by the
        machine holding it; an ambiguous or unknown one is the CLI's error."""
        machine, run_id, ref = _target(request)
        if is_run_prefix(run_id):
            named = await in_thread(lambda: operations.status(client, machine, run_id, scope.machine_timeout_s))
            run_id, ref = named.agent_id, format_reference(machine, named.agent_id)
        return machine, run_id, ref

    async def _facts(machine: str, run_id: str) -> tuple[object, str | None]:
        try:
            return await in_thread(lambda: operations.status(client, machine, run_id, scope.machine_timeout_s)), None
        except WbError as exc:
            return None, exc.message

    async def run_page(request: Request, notice: str = "", status: int = 200) -> Response:
        try:
            machine, run_id, ref = await _whole(request)
        except WbError as exc:
            return not_a_run(request, exc)
        if ref != request.path_params["ref"] and not notice:  # a short reference: the page's address names the run
            return RedirectResponse(pages.run_path(root(request), ref), status_code=303)
        result, error = await _facts(machine, run_id)
        shown = ""
        if result is not None:
            with contextlib.suppress(WbError):
                shown = await in_thread(lambda: operations.actions(client, machine, run_id, scope.machine_timeout_s))
        return html(pages.run_page(root(request), ref, result, error, shown, notice), status)  # type: ignore[arg-type]

    async def run_facts(request: Request) -> Response:
        try:
            machine, run_id, ref = await _whole(request)
        except WbError as exc:
            return html(pages.facts_fragment(root(request), "", None, exc.message), 404)
        result, error = await _facts(machine, run_id)
        return html(pages.facts_fragment(root(request), ref, result, error))  # type: ignore[arg-type]

    async def run_diff(request: Request) -> Response:
        try:
            machine, run_id, _ = await _whole(request)
            found = await in_thread(lambda: operations.diff(client, machine, run_id))
        except WbError as exc:
            return html(pages.diff_fragment(None, exc.message))
        return html(pages.diff_fragment(found, None))

    async def run_patch(request: Request) -> Response:
        """What `wb agent diff REF` prints, as a file `git apply` takes."""
        try:
            machine, run_id, _ = await _whole(request)
            found = await in_thread(lambda: operations.diff(client, machine, run_id))
        except WbError as exc:
            return PlainTextResponse(f"{actions.cli_message(exc)}\n", status_code=actions.refusal_status(exc))
        headers = {"content-disposition": f'inline; filename="{run_id}.patch"'}
        return Response(found.patch or "", media_type="text/x-diff; charset=utf-8", headers=headers)

    async def run_log(request: Request) -> Response:
        """The run's raw transcript, as `wb agent logs REF --raw` prints it (after its path line)."""
        try:
            machine, run_id, _ = await _whole(request)
            text = await in_thread(lambda: operations.raw_log(client, machine, run_id, scope.machine_timeout_s))
        except WbError as exc:
            return PlainTextResponse(f"{actions.cli_message(exc)}\n", status_code=actions.refusal_status(exc))
        return PlainTextResponse(text)

    async def run_actions(request: Request) -> Response:
        try:
            machine, run_id, _ = await _whole(request)
        except UsageError as exc:
            return not_a_run(request, exc)
        except WbError as exc:
            return PlainTextResponse(f"{actions.cli_message(exc)}\n", status_code=actions.refusal_status(exc))
        stream = follow_lines(client, machine, run_id)
        return StreamingResponse(stream, media_type="text/event-stream", headers=_EVENT_STREAM_HEADERS)

    async def _form(request: Request) -> dict[str, str] | Response:
        try:
            return actions.parse_form(await request.body())
        except actions.FormTooLarge:
            too_large = f"error: the form is larger than {actions.FORM_MAX_TEXT}"
            return html(pages.message_page(root(request), "too large", too_large, root(request) + "/"), 413)
        except actions.FormMalformed as exc:
            return PlainTextResponse(f"error: {exc}\n", status_code=400)

    async def stop(request: Request) -> Response:
        form = await _form(request)
        if isinstance(form, Response):
            return form
        try:
            machine, run_id, ref = _target(request)
        except UsageError as exc:
            return not_a_run(request, exc)
        if form.get("confirm") != "yes":
            return html(pages.confirm_stop_page(root(request), ref))
        try:
            bound_s = scope.machine_timeout_s
            message, warnings = await in_thread(lambda: operations.stop(client, machine, run_id, bound_s))
        except WbError as exc:
            back = pages.run_path(root(request), ref)
            page = pages.message_page(root(request), f"stop {ref}", actions.cli_message(exc), back)
            return html(page, actions.refusal_status(exc))
        notice = "\n".join([message, *(f"warning: {warning}" for warning in warnings)])
        return await run_page(request, notice)

    async def continue_(request: Request) -> Response:
        form = await _form(request)
        if isinstance(form, Response):
            return form
        reference = request.path_params["ref"]
        task = actions.review_task(form)  # the task as typed, after any comments on the diff
        try:
            _target(request)
            result = await in_thread(lambda: operations.continue_run(client, reference, task))
        except WbError as exc:
            back = pages.run_path(root(request), reference)
            page = pages.message_page(root(request), f"continue {reference}", actions.cli_message(exc), back)
            return html(page, actions.refusal_status(exc))
        ref = format_reference(result.machine or "", result.agent_id)
        return RedirectResponse(pages.run_path(root(request), ref), status_code=303)

    async def static_file(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in static:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(static[name], media_type=_STATIC[name])

    routes = [
        Route("/", fleet_page),
        Route("/fleet", fleet_fragment),
        Route("/events", events),
        Route("/run/{ref}", run_page),
        Route("/run/{ref}/facts", run_facts),
        Route("/run/{ref}/diff", run_diff),
        Route("/run/{ref}/actions", run_actions),
        Route("/run/{ref}/patch", run_patch),
        Route("/run/{ref}/log", run_log),
        Route("/run/{ref}/stop", stop, methods=["POST"]),
        Route("/run/{ref}/continue", continue_, methods=["POST"]),
        Route("/static/{name}", static_file),
    ]
    return TokenGate(Starlette(routes=routes, lifespan=lifespan), token, port)


def _scope_words(scope: Scope) -> str:
    if scope.machines == ("",):
        return "this machine's runs"
    return "the runs of " + ", ".join(machine or "this machine" for machine in scope.machines)

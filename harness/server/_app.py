"""The ASGI app: a bearer token on every endpoint, an Origin check, typed errors, and the API's paths
(docs/server.md).

Every error is `{"error": {"kind": ..., "message": ..., ...}}` with a 4xx status, and a refused request
changes nothing. Requests carry JSON objects of at most 64 KiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import Enum
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._paths import overlaps
from ._loops import Loop, Loops
from ._modules import BindingError, agent_section
from ._pending import Pending
from ._state import State, StateError, Workspace
from ._workspace_config import WorkspaceConfigError, merged, sections_of, written

__all__ = ["create_app"]

MAX_BODY = 64 * 1024
_PAGE = (Path(__file__).parent / "static" / "index.html").read_text(encoding="utf-8")
#: The page may run its own inline script and call this server, nothing else, and is never framed.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.detail = status, kind, detail


def error(status: int, kind: str, message: str, **detail: Any) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message, **detail}}, status_code=status)


class _Guard(BaseHTTPMiddleware):
    """The token on every request, a Host this server answers to (not a rebound DNS name), and a browser's
    Origin only when it is this server's own."""

    def __init__(self, app: Any, state: State, hosts: frozenset[str] | None) -> None:
        super().__init__(app)
        self.expected = f"Bearer {state.token}".encode()
        self.hosts = hosts

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        host = request.headers.get("host", "")
        if self.hosts is not None and host not in self.hosts:
            return error(403, "host_refused", f"this server does not answer to {host!r} (DNS rebinding?)")
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin is not None and origin != own:
            return error(403, "origin_refused", f"requests from {origin} are refused (only {own})")
        if request.url.path == "/" and request.method == "GET":  # the page holds no data: its calls carry the token
            return await call_next(request)
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, self.expected):
            response = error(401, "unauthorized", "a bearer token is required: Authorization: Bearer TOKEN")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await call_next(request)


def create_app(state: State, *, allow_once_after_s: float = 15.0, hosts: frozenset[str] | None = None) -> Starlette:
    """`allow_once_after_s`: the idle allow-once countdown (0 turns it off); `hosts`: the Host
    headers answered (`serve` gives its own address's names; None answers any)."""
    loops = Loops(state)
    stopping = asyncio.Event()  # set by `serve` on a signal: event streams end so the shutdown can run

    def endpoint(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            try:
                status, body = await handler(request)
            except ApiError as exc:
                return error(exc.status, exc.kind, str(exc), **exc.detail)
            except StateError as exc:
                return error(exc.status, exc.kind, str(exc), **exc.detail)
            return JSONResponse(body, status_code=status)

        return respond

    async def get_autonomy(request: Request) -> tuple[int, Any]:
        return 200, {"enabled": state.autonomy_enabled}

    async def put_autonomy(request: Request) -> tuple[int, Any]:
        body = await _json_object(request)
        enabled = body.get("enabled")
        if set(body) != {"enabled"} or not isinstance(enabled, bool):
            raise ApiError(422, "invalid", 'the body is {"enabled": true|false}', key="enabled")
        state.set_autonomy(enabled)
        for loop in list(loops.loops.values()):
            if loop.live and loop.prompt is None and not enabled:
                loop.stop("autonomy_disabled")  # the switch is the operator's stop: autonomous loops end Cancelled
            if loop.live and loop.pending is not None:
                loop.pending.rearm()  # a countdown follows eligibility, fresh when it returns
        return 200, {"enabled": state.autonomy_enabled}

    async def list_workspaces(request: Request) -> tuple[int, Any]:
        return 200, {"workspaces": [w.as_json() for w in state.workspaces()]}

    async def add_workspace(request: Request) -> tuple[int, Any]:
        """Register a worktree with the sections of a run config (harness/server/_workspace_config.py)."""
        body = await _json_object(request)
        given, sections = _sections(body, path_required=True)
        path = await asyncio.to_thread(_worktree, given)  # runs git: off the event loop
        state_dir = os.path.realpath(state.directory)
        if overlaps(path, state_dir):
            raise ApiError(422, "not_a_worktree", f"{path} holds or is inside the server's state directory "
                           f"{state_dir}, which every agent is kept from", key="path")  # fmt: skip
        sections = written(sections)
        _refuse_overlap(path)
        await asyncio.to_thread(loops.validate, path, sections)
        _refuse_overlap(path)  # again: another registration may have landed while this one was checked
        return 201, state.add_workspace(path, sections).as_json()

    def _refuse_overlap(path: str) -> None:
        for other in state.workspaces():  # nested worktrees: one loop's agent could write the other's files
            if path != other.path and overlaps(path, other.path):  # the same path: `workspace_exists`, below
                raise ApiError(409, "workspace_overlap", f"{path} holds or is inside workspace {other.id} "
                               f"({other.path})", workspace=other.id)  # fmt: skip

    async def edit_workspace(request: Request) -> tuple[int, Any]:
        """PUT replaces the config, PATCH replaces the sections it names (`null` drops one): a new version,
        refused while a session (or a loop waiting to drain again) is live."""
        workspace = workspace_of(request)
        body = await _json_object(request)
        given, sections = _sections(body, path_required=False)
        if given is not None and not _same_path(given, workspace.path):
            raise ApiError(422, "invalid", f"a workspace's path is fixed ({workspace.path}): register the other "
                           "worktree as its own workspace", key="path")  # fmt: skip
        sections = merged(workspace.config, sections) if request.method == "PATCH" else written(sections)
        live = loops.live(workspace.id)
        if live is not None or workspace.id in loops.starting:
            raise ApiError(409, "session_live", "a session is live or starting: deactivate or cancel it before "
                           "editing the config", session=live.run_id if live else None)  # fmt: skip
        await asyncio.to_thread(loops.validate, workspace.path, sections)
        if loops.live(workspace.id) is not None or workspace.id in loops.starting:  # activated meanwhile
            raise ApiError(409, "session_live", "a session started while the edit was checked")
        return 200, state.edit_workspace(workspace.id, sections).as_json()

    async def delete_workspace(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        live = loops.live(workspace.id)
        if live is not None or workspace.id in loops.starting:
            raise ApiError(409, "session_live", f"workspace {workspace.id} has a live session: deactivate it first",
                           session=live.run_id if live else None)  # fmt: skip
        state.delete_workspace(workspace.id)
        loops.forget(workspace.id)
        return 200, {"deleted": workspace.id}

    async def get_versions(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        return 200, {"version": workspace.version, "versions": state.versions(workspace.id)}

    async def get_completed(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        return 200, await asyncio.to_thread(loops.completed_listing, workspace)

    async def reset_completed(request: Request) -> tuple[int, Any]:
        """Forget the completed ids (every queue this workspace has drained): the next activation runs them."""
        workspace = workspace_of(request)
        if loops.live(workspace.id) is not None:
            raise ApiError(409, "session_live", "a session is live: its completions are being written")
        return 200, {"forgotten": await asyncio.to_thread(loops.forget_completed, workspace)}

    async def get_workspace(request: Request) -> tuple[int, Any]:
        return 200, state.workspace(request.path_params["workspace_id"]).as_json()

    def workspace_of(request: Request) -> Workspace:
        return state.workspace(request.path_params["workspace_id"])

    async def put_binding(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        body = await _json_object(request)
        try:
            agent_section(body)
        except BindingError as exc:
            raise ApiError(422, "invalid", str(exc), key=exc.key) from None
        live = loops.live(workspace.id)
        if live is not None and live.binding != body:  # another module, or the same one with another agent
            raise ApiError(409, "session_live", f"session {live.run_id} of module {live.module!r} is live: stop it "
                           "before binding another agent", session=live.run_id, module=live.module)  # fmt: skip
        state.set_binding(workspace.id, body)
        return 200, state.workspace(workspace.id).as_json()

    async def delete_binding(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        live = loops.live(workspace.id)
        if live is not None:
            raise ApiError(409, "session_live", f"session {live.run_id} is live: cancel it or let it end first",
                           session=live.run_id, module=live.module)  # fmt: skip
        state.set_binding(workspace.id, None)
        return 200, state.workspace(workspace.id).as_json()

    async def put_activation(request: Request) -> tuple[int, Any]:
        """`{"active": true}` drains the queue to Idle; `{"active": true, "keep_draining": {"every_s": 60}}`
        keeps the loop past Idle, listing the queue again every so often; `{"active": false}` stops it."""
        workspace = workspace_of(request)
        body = await _json_object(request)
        active = body.get("active")
        if not set(body) <= {"active", "keep_draining"} or not isinstance(active, bool):
            raise ApiError(422, "invalid", 'the body is {"active": true|false} (with "keep_draining": '
                           '{"every_s": S} to keep draining past Idle)', key="active")  # fmt: skip
        every_s = _keep_draining(body.get("keep_draining"))
        if active:
            live = loops.live(workspace.id)
            if live is not None and live.prompt is None and live.keep_draining_s != every_s:
                raise ApiError(409, "session_live", f"session {live.run_id} is live with other options: deactivate "
                               "it first", session=live.run_id)  # fmt: skip
            loop = await loops.activate(workspace, every_s)
            return 200, {"active": True, "session": loop.run_id, "keep_draining": _draining(loop)}
        live = loops.live(workspace.id)
        if live is not None:
            live.stop()
        return 200, {"active": False, "session": live.run_id if live else None}

    async def get_loop(request: Request) -> tuple[int, Any]:
        return 200, loop_status(workspace_of(request))

    async def post_steering(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        text = await _text_body(request)
        live = _live_or_409(loops, workspace)
        if live.waiting is not None:
            raise ApiError(409, "no_live_session", "the loop is waiting for work: no session to steer")
        live.kernel.steer(text)
        return 202, {"queued": True, "pending": len(live.kernel.steering_pending), "session": live.run_id}

    async def post_cancel(request: Request) -> tuple[int, Any]:
        live = _live_or_409(loops, workspace_of(request))
        live.stop("user_cancel")
        return 202, {"cancelling": True, "session": live.run_id}

    async def loop_events(request: Request) -> Response:
        """Server-sent events: the loop status each time it changes (checked every 100 ms), ending with the
        session's end, or at once with the last one when no loop runs."""
        try:
            workspace = workspace_of(request)
        except StateError as exc:
            return error(exc.status, exc.kind, str(exc), **exc.detail)

        async def events() -> AsyncIterator[str]:
            last = None
            while not await request.is_disconnected() and not stopping.is_set():
                status = loop_status(workspace)
                if status != last:
                    yield f"event: loop\ndata: {json.dumps(status)}\n\n"
                    last = status
                if loops.live(workspace.id) is None and status["state"] != "running":
                    return
                await asyncio.sleep(0.1)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def post_prompt(request: Request) -> tuple[int, Any]:
        """A single-prompt session; with an empty policy, the interactive path (permissions over the API)."""
        workspace = workspace_of(request)
        text = await _text_body(request)
        loop = await loops.start_prompt(workspace, text, allow_once_after_s)
        return 202, {"session": loop.run_id, "interactive": loop.pending is not None}

    def pending_of(workspace: Workspace) -> Pending:
        live = _live_or_409(loops, workspace)
        if live.pending is None:
            raise ApiError(409, "not_interactive", f"session {live.run_id} is decided by the policy, not a person")
        return live.pending

    async def get_permissions(request: Request) -> tuple[int, Any]:
        workspace = workspace_of(request)
        live = loops.live(workspace.id)
        waiting = live.pending.listing() if live is not None and live.pending is not None else []
        return 200, {"pending": waiting}

    async def answer_permission(request: Request) -> tuple[int, Any]:
        pending = pending_of(workspace_of(request))
        body = await _json_object(request)
        request_id = request.path_params["request_id"]
        waiting = pending.requests.get(request_id)
        if waiting is None:
            raise ApiError(404, "no_such_request", f"no pending request {request_id!r}")
        options = {o.get("optionId") for o in waiting.params.get("options") or []}
        if body == {"outcome": "cancelled"}:
            outcome: dict[str, Any] = {"outcome": "cancelled"}
        elif set(body) == {"optionId"} and isinstance(body["optionId"], str) and body["optionId"] in options:
            outcome = {"outcome": "selected", "optionId": body["optionId"]}
        else:
            raise ApiError(422, "invalid", f'the body is {{"optionId": one of {sorted(options)}}} or '
                           '{"outcome": "cancelled"}', key="optionId")  # fmt: skip
        if not pending.reply(request_id, outcome):  # the countdown (or the session's end) got there first
            raise ApiError(409, "already_answered", f"request {request_id!r} was answered before this reply")
        return 200, {"answered": request_id, **outcome}

    async def resume_session(request: Request) -> tuple[int, Any]:
        """Activate again after an earlier session (its completed tasks are skipped): refused, typed, when that
        session ran another module than the one bound now."""
        workspace = workspace_of(request)
        session_id = request.path_params["session_id"]
        earlier = next((r for r in state.runs(workspace.id) if r["id"] == session_id), None)
        if earlier is None:
            raise ApiError(404, "no_such_session", f"workspace {workspace.id} has no session {session_id!r}")
        bound = (workspace.binding or {}).get("module")
        if earlier["module"] != bound:
            message = f"session {session_id} ran {earlier['module']!r}, the bound module is {bound!r}"
            raise ApiError(409, "module_mismatch", message, session=session_id, module=earlier["module"], bound=bound)
        live = loops.live(workspace.id)
        if live is not None:
            raise ApiError(409, "session_live", f"session {live.run_id} is live", session=live.run_id)
        loop = await loops.activate(workspace)
        return 200, {"active": True, "session": loop.run_id, "resumes": session_id}

    async def get_sessions(request: Request) -> tuple[int, Any]:
        return 200, {"sessions": state.runs(workspace_of(request).id)}

    def loop_status(workspace: Workspace) -> dict[str, Any]:
        """session.loop: state, task, iteration, rule ids, terminal and reason, the steering queue."""
        live = loops.live(workspace.id)
        if live is not None and live.waiting is not None:  # kept draining: between sessions
            return {"state": "waiting", **live.waiting, "session": live.run_id, "module": live.module,
                    "version": live.version, **live.ended, "rule_ids": [], "steering": [],
                    "keep_draining": _draining(live)}  # fmt: skip
        if live is not None:
            status = {k: v.value if isinstance(v, Enum) else v for k, v in live.kernel.status.items()}
            return {**status, "session": live.run_id, "module": live.module, "version": live.version,
                    "steering": live.kernel.steering_pending, "keep_draining": _draining(live)}  # fmt: skip
        history = state.runs(workspace.id)
        if not history:
            return {"state": "new", "session": None, "rule_ids": [], "steering": []}
        last = history[-1]
        return {"state": "ended", "session": last["id"], "module": last["module"], "terminal": last["terminal"],
                "reason": last["reason"], "tasks": last["tasks"], "version": last["version"], "rule_ids": [],
                "steering": []}  # fmt: skip

    async def page(request: Request) -> Response:
        return HTMLResponse(_PAGE, headers=_PAGE_HEADERS)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/api/autonomy", endpoint(get_autonomy), methods=["GET"]),
        Route("/api/autonomy", endpoint(put_autonomy), methods=["PUT"]),
        Route("/api/workspaces", endpoint(list_workspaces), methods=["GET"]),
        Route("/api/workspaces", endpoint(add_workspace), methods=["POST"]),
        Route("/api/workspaces/{workspace_id}", endpoint(get_workspace), methods=["GET"]),
        Route("/api/workspaces/{workspace_id}", endpoint(edit_workspace), methods=["PUT", "PATCH"]),
        Route("/api/workspaces/{workspace_id}", endpoint(delete_workspace), methods=["DELETE"]),
        Route("/api/workspaces/{workspace_id}/versions", endpoint(get_versions), methods=["GET"]),
        Route("/api/workspaces/{workspace_id}/completed", endpoint(get_completed), methods=["GET"]),
        Route("/api/workspaces/{workspace_id}/completed", endpoint(reset_completed), methods=["DELETE"]),
        Route("/api/workspaces/{workspace_id}/agent/binding", endpoint(put_binding), methods=["PUT"]),
        Route("/api/workspaces/{workspace_id}/agent/binding", endpoint(delete_binding), methods=["DELETE"]),
        Route("/api/workspaces/{workspace_id}/agent/autonomy", endpoint(put_activation), methods=["PUT"]),
        Route("/api/workspaces/{workspace_id}/loop", endpoint(get_loop), methods=["GET"]),
        Route("/api/workspaces/{workspace_id}/loop/events", loop_events, methods=["GET"]),
        Route("/api/workspaces/{workspace_id}/loop/steering", endpoint(post_steering), methods=["POST"]),
        Route("/api/workspaces/{workspace_id}/loop/cancel", endpoint(post_cancel), methods=["POST"]),
        Route("/api/workspaces/{workspace_id}/sessions", endpoint(get_sessions), methods=["GET"]),
        Route(
            "/api/workspaces/{workspace_id}/sessions/{session_id}/resume", endpoint(resume_session), methods=["POST"]
        ),
        Route("/api/workspaces/{workspace_id}/prompt", endpoint(post_prompt), methods=["POST"]),
        Route("/api/workspaces/{workspace_id}/permissions", endpoint(get_permissions), methods=["GET"]),
        Route("/api/workspaces/{workspace_id}/permissions/{request_id}", endpoint(answer_permission), methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loops.recover()  # loops the last server left active: Failed/restarted, their agents ended
        yield
        await loops.stop_all()  # stopping cancels the loops in progress: each ends Cancelled

    app = Starlette(routes=routes, middleware=[Middleware(_Guard, state=state, hosts=hosts)], lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed})  # fmt: skip
    app.state.stopping = stopping
    return app


def _live_or_409(loops: Loops, workspace: Workspace) -> Loop:
    live = loops.live(workspace.id)
    if live is None:
        raise ApiError(409, "no_live_session", f"workspace {workspace.id} has no loop running")
    return live


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(404, "not_found", f"no endpoint {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")


async def _json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object: read no further than the limit, and only text that can be stored and sent
    back (a lone surrogate escape would be kept, then fail every answer that shows it)."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ApiError(413, "too_large", f"the body is over {MAX_BODY} bytes")
    try:
        body = json.loads(bytes(raw) or b"null")
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise ApiError(400, "not_json", f"the body is not JSON this server can keep: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "not_an_object", "the body must be a JSON object")
    return body


async def _text_body(request: Request) -> str:
    """`{"text": "..."}`, not empty (steering and prompts)."""
    body = await _json_object(request)
    text = body.get("text")
    if set(body) != {"text"} or not isinstance(text, str) or not text.strip():
        raise ApiError(422, "invalid", 'the body is {"text": "..."} (not empty)', key="text")
    return text


#: The shortest keep-draining interval: a listing is one host call (GitHub allows 5,000 an hour per token).
MIN_EVERY_S = 0.2


def _keep_draining(value: Any) -> float | None:
    if value is None or value is False:
        return None
    every = value.get("every_s") if isinstance(value, dict) and set(value) == {"every_s"} else None
    if isinstance(every, bool) or not isinstance(every, int | float) or not MIN_EVERY_S <= every <= 86400:
        raise ApiError(422, "invalid", f'keep_draining is {{"every_s": S}}, {MIN_EVERY_S} <= S <= 86400',
                       key="keep_draining")  # fmt: skip
    return float(every)


def _draining(loop: Loop) -> dict[str, float] | None:
    return {"every_s": loop.keep_draining_s} if loop.keep_draining_s is not None else None


def _sections(body: dict[str, Any], *, path_required: bool) -> tuple[str | None, dict[str, Any]]:
    try:
        return sections_of(body, path_required=path_required)
    except WorkspaceConfigError as exc:
        raise ApiError(422, "invalid", str(exc), key=exc.key) from None


def _same_path(given: Any, path: str) -> bool:
    try:
        return isinstance(given, str) and os.path.realpath(given) == path
    except ValueError:  # a NUL byte
        return False


def _worktree(value: Any) -> str:
    """The absolute path of a git worktree's top level (what the loop binds), or a 422."""
    if not isinstance(value, str) or not value or not Path(value).is_absolute():
        raise ApiError(422, "invalid", "path must be the absolute path of a git worktree", key="path")
    try:
        path = Path(value).resolve()
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, check=False, timeout=10)  # fmt: skip
        top = Path(done.stdout.strip()).resolve() if done.returncode == 0 else None
        is_dir = path.is_dir()
    except (ValueError, OSError, subprocess.TimeoutExpired) as exc:  # a NUL, a name too long, a hung git
        raise ApiError(422, "not_a_worktree", f"{value[:200]!r} cannot be used: {exc}", key="path") from None
    if not is_dir or top != path:
        raise ApiError(422, "not_a_worktree", f"{path} is not the top level of a git worktree", key="path")
    return str(path)

"""The ASGI application: the dashboard, its event stream, ``/metrics``, the login and the audited actions.

Routes:

* ``GET /``: the dashboard page (live through ``GET /api/stream``, server-sent events);
* ``GET /api/snapshot``: the same view once, as JSON;
* ``GET /metrics``: the Prometheus text exposition, read from the database at scrape time;
* ``GET /healthz``: ``ok``;
* ``POST /login`` (form field ``token``), ``POST /logout``;
* ``POST /actions/pause|resume|policy|release``: each needs the operator session, the
  session's CSRF token (form field ``csrf``) and ``confirm`` equal to the action's name,
  else it changes nothing. Each calls one plane operation, which journals itself without
  identifiers (``admission_paused``, ``admission_resumed``, ``policy_revised``,
  ``operator_seat_released``).

Every response forbids framing and caching; the page runs no inline script.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse as Streaming
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..clock import wall_clock_ms
from ..errors import AdmissionError, InvalidInputError
from ..policy import Policy
from ._auth import SESSION_COOKIE, SESSION_SECONDS, Guard
from ._metrics import CONTENT_TYPE, exposition
from ._readings import Reader
from ._snapshot import Hub, view

HERE = Path(__file__).resolve().parent
ACTIONS = ("pause", "resume", "policy", "release")
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" would make a browser send "Origin: null" on our own forms
    "Cache-Control": "no-store",
}


class _SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        return response


class Refused(Exception):
    """An action refused before it changed anything: the HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def create_app(
    plane: Any,
    *,
    token: str | None = None,
    tick_seconds: float = 1.0,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], int] = wall_clock_ms,
) -> Starlette:
    """The application on ``plane`` (an :class:`~admission_plane.AdmissionPlane`; the caller closes it).

    ``token`` is the operator token (``None``: read-only). ``log`` receives one line per
    action (no identifier, never the token); default standard error.
    """
    guard = Guard(token)
    reader = Reader(plane, handle_key=guard.csrf_token("lease-handles").encode())
    hub = Hub(lambda: view(reader.read(clock())), tick_seconds)
    templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape())
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def session_of(request: Request) -> str | None:
        return guard.session(request.cookies.get(SESSION_COOKIE))

    async def page(request: Request) -> Response:
        session = session_of(request)
        html = templates.get_template("dashboard.html").render(
            operator=session is not None,
            actions_enabled=guard.enabled,
            csrf="" if session is None else guard.csrf_token(session),
            database=getattr(plane, "engine", None) and _shown(plane),
        )
        return HTMLResponse(html)

    async def snapshot(request: Request) -> Response:
        data = await run_in_threadpool(lambda: view(reader.read(clock())))
        return JSONResponse(data)

    async def stream(request: Request) -> Response:
        return Streaming(
            hub.stream(),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no", "Cache-Control": "no-store"},
        )

    async def metrics(request: Request) -> Response:
        def scrape() -> bytes:
            started = time.perf_counter()
            reading = reader.read(clock())
            return exposition(reading, time.perf_counter() - started)

        return Response(await run_in_threadpool(scrape), media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def login(request: Request) -> Response:
        form = await request.form()
        if not guard.enabled:
            return _refusal(403, "this server is read-only: it was started without an operator token")
        try:
            _check_origin(request)
        except Refused as refused:
            return _refusal(refused.status, str(refused))
        presented = form.get("token")
        if not guard.token_matches(presented if isinstance(presented, str) else None):
            say("admission-plane serve: login refused (wrong operator token)")
            return _refusal(401, "wrong operator token")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            guard.issue_session(),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def action(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ACTIONS:
            return _refusal(404, f"no action {name!r}")
        try:
            form = {key: value for key, value in (await request.form()).items() if isinstance(value, str)}
            _authorise(request, form, name)
            message = await run_in_threadpool(_perform, name, form)
        except Refused as refused:
            say(f"admission-plane serve: action {name} refused ({refused.status}): {refused}")
            return _refusal(refused.status, str(refused))
        say(f"admission-plane serve: action {name}: {message}")
        hub.poke()
        return JSONResponse({"ok": True, "action": name, "message": message})

    def _authorise(request: Request, form: dict[str, str], name: str) -> None:
        if not guard.enabled:
            raise Refused(403, "this server is read-only: it was started without an operator token")
        _check_origin(request)
        session = session_of(request)
        if session is None:
            raise Refused(401, "log in with the operator token first")
        if not guard.csrf_matches(session, form.get("csrf")):
            raise Refused(403, "missing or wrong CSRF token; nothing was changed")
        if form.get("confirm") != name:
            raise Refused(400, f"not confirmed (confirm={name} is required); nothing was changed")

    def _perform(name: str, form: dict[str, str]) -> str:
        try:
            if name in ("pause", "resume"):
                return _pause_or_resume(name, form)
            if name == "policy":
                return _set_policy(form)
            return _release(form)
        except InvalidInputError as error:
            raise Refused(400, str(error)) from None
        except AdmissionError as error:
            raise Refused(409, str(error)) from None

    def _pause_or_resume(name: str, form: dict[str, str]) -> str:
        scope = form.get("scope", "all")
        lane = form.get("lane") or None
        provider = form.get("provider") or None
        model = form.get("model") or None
        if scope == "all":
            lane = provider = model = None
        elif scope == "lane":
            if lane is None:
                raise Refused(400, "a lane pause names its lane")
            provider = model = None
        elif scope == "key":
            if provider is None or model is None:
                raise Refused(400, "a key pause names its provider and model")
            lane = None
        else:
            raise Refused(400, "scope must be all, lane or key")
        operation = getattr(plane, name, None)
        if operation is None:
            raise Refused(501, f"this version of the plane cannot {name} admission")
        changed = operation(lane=lane, provider=provider, model=model)
        verb = "paused" if name == "pause" else "resumed"
        return f"{verb} ({scope})" if changed else f"nothing to change: already {verb} ({scope})"

    def _set_policy(form: dict[str, str]) -> str:
        setter = getattr(plane, "set_policy", None)
        if setter is None:
            raise Refused(501, "this version of the plane has no live policy")
        document = form.get("policy", "")
        policy = Policy.from_json(document)
        revision = setter(policy)
        return f"policy revision {revision.revision} is in force"

    def _release(form: dict[str, str]) -> str:
        handle = form.get("lease", "")
        lease_id = reader.lease_for(handle) if handle else None
        if lease_id is None:
            raise Refused(404, "no seat-holding lease has that handle (it may have ended already)")
        released = plane.release_lease(lease_id, clock())
        return f"released a seat held in {released.phase}; its request is {released.outcome}, never requeued"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        hub.start()
        try:
            yield
        finally:
            await hub.stop()

    routes = [
        Route("/", page),
        Route("/api/snapshot", snapshot),
        Route("/api/stream", stream),
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/actions/{name}", action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)], lifespan=lifespan)
    app.state.hub = hub
    app.state.reader = reader
    app.state.guard = guard
    return app


def _check_origin(request: Request) -> None:
    """A browser's cross-site POST carries a foreign ``Origin``: refuse it (a same-site one, or none, passes)."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin != expected:
        raise Refused(403, "cross-origin request refused; nothing was changed")


def _refusal(status: int, reason: str) -> Response:
    return JSONResponse({"ok": False, "error": reason}, status_code=status)


def _shown(plane: Any) -> str:
    from ..store.engine import redacted_url

    url = plane.engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return str(url.database)
    return redacted_url(url)

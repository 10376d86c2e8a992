"""The search page: plain HTML, CSS and JS served by the app (no build step, no CDN).

:class:`PageFiles` answers ``GET`` of the page's few files before the request guard, so that a
browser loads the page without the API key (a navigation cannot send one); the page asks for
the key, keeps it in ``sessionStorage`` and sends it as a Bearer token with every API call,
which the guard checks as for any client. Any other path goes on to the guard unchanged.
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["PAGE_PATHS", "PageFiles"]

# URL path -> (file in this package, media type)
PAGE_PATHS: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/": ("index.html", "text/html; charset=utf-8"),
    "/ui/search.js": ("search.js", "text/javascript; charset=utf-8"),
    "/ui/search.css": ("search.css", "text/css; charset=utf-8"),
}
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # everything from this origin only: works offline, and no injected script can run
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


class PageFiles:
    """ASGI middleware serving the page's static files; everything else passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        package = resources.files(__package__)
        self.files = {
            path: (package.joinpath(name).read_bytes(), media)
            for path, (name, media) in PAGE_PATHS.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] in self.files:
            body, media = self.files[scope["path"]]
            await Response(body, media_type=media, headers=_HEADERS)(scope, receive, send)
            return
        await self.app(scope, receive, send)

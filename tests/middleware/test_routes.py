"""Route templates found by asking real Starlette and Flask routers, through
the middleware stacks that sit in front of them."""

import pytest
from flask import Flask
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route, Router

from fastlimit.middleware.routes import asgi_route_resolver, wsgi_route_resolver


async def ok(request):
    return PlainTextResponse("ok")


def starlette_app():
    return Starlette(routes=[
        Route("/items/{item_id:int}", ok),
        Route("/export", ok, methods=["POST"]),
        Mount("/api", routes=[Route("/users/{name}", ok),
                              Mount("/v2", routes=[Route("/orders/{id}", ok)])]),
    ])


def scope(path, method="GET"):
    return {"type": "http", "method": method, "path": path, "root_path": "",
            "headers": [], "query_string": b""}


@pytest.mark.parametrize("path, method, template", [
    ("/items/3", "GET", "/items/{item_id:int}"),
    ("/items/x", "GET", None),                     # the int convertor does not match
    ("/export", "POST", "/export"),
    ("/export", "GET", "/export"),                 # wrong method: still the route (405)
    ("/api/users/bob", "GET", "/api/users/{name}"),
    ("/api/v2/orders/9", "GET", "/api/v2/orders/{id}"),
    ("/nowhere", "GET", None),
])
def test_starlette_templates(path, method, template):
    assert asgi_route_resolver(starlette_app())(scope(path, method)) == template


def test_starlette_router_found_through_the_middleware_stack():
    """add_middleware hands the middleware the inner stack, not the app."""

    class Probe:
        def __init__(self, app):
            self.app = app

    app = starlette_app()
    app.user_middleware.insert(0, Middleware(Probe))
    stack = app.build_middleware_stack()
    probe = stack
    while not isinstance(probe, Probe):
        probe = probe.app
    assert asgi_route_resolver(probe.app)(scope("/items/1")) == "/items/{item_id:int}"


def test_plain_asgi_apps_have_no_templates():
    async def app(scope, receive, send):
        pass

    assert asgi_route_resolver(app) is None
    assert asgi_route_resolver(Router(routes=[Route("/a/{b}", ok)]))(scope("/a/1")) == "/a/{b}"


def flask_app():
    app = Flask(__name__)
    app.add_url_rule("/users/<int:user_id>", "users", lambda user_id: "ok")
    app.add_url_rule("/login", "login", lambda: "ok", methods=["POST"])
    return app


def environ(path, method="GET"):
    return {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "",
            "SERVER_NAME": "localhost", "SERVER_PORT": "80", "HTTP_HOST": "localhost",
            "wsgi.url_scheme": "http"}


@pytest.mark.parametrize("path, method, template", [
    ("/users/7", "GET", "/users/<int:user_id>"),
    ("/users/x", "GET", None),
    ("/login", "POST", "/login"),
    ("/login", "GET", None),          # werkzeug raises MethodNotAllowed: use the path
    ("/nowhere", "GET", None),
])
def test_flask_templates(path, method, template):
    app = flask_app()
    # both ways of wrapping: the app itself and its wsgi_app bound method
    assert wsgi_route_resolver(app)(environ(path, method)) == template
    assert wsgi_route_resolver(app.wsgi_app)(environ(path, method)) == template


def test_plain_wsgi_apps_have_no_templates():
    assert wsgi_route_resolver(lambda environ, start: []) is None

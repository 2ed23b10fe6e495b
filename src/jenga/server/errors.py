"""Errors in OpenAI's body format: ``{"error": {"message", "type", "param", "code"}}``.

A client's mistake is a 4xx :class:`APIError` (raised by the request mapping, the auth and
size guard, the queue), never a 500.  :func:`install_handlers` turns these, FastAPI's
validation errors and jenga's typed errors into that body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jenga.errors import JengaError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}


class APIError(Exception):
    """An HTTP error with OpenAI's body; ``headers`` (e.g. ``Retry-After``) go on the response."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    first = errs[0] if errs else {}
    if first.get("type") == "json_invalid":  # the body is no JSON: no parameter is at fault
        return JSONResponse(error_body(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
                                       .rstrip(": "), None, "invalid_json"), status_code=400)
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request body")
    return JSONResponse(error_body(400, msg, param, "invalid_value"), status_code=400)


def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own 404 (no such route) / 405 (wrong method) ... in OpenAI's body."""
    codes = {404: "not_found", 405: "method_not_allowed"}
    return JSONResponse(error_body(exc.status_code, str(exc.detail), None, codes.get(exc.status_code)),
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(APIError, lambda _, e: e.response())
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(JengaError, lambda _, e: APIError(400, str(e), code="invalid_value").response())

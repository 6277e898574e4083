"""Request parsing and reply shaping shared by the handlers.

Bodies are JSON objects with a size cap; fields are checked here with their JSON types so a
malformed body is a 400 ``bad_request`` naming the field, never a 500. Contract messages become
JSON by their wire map (``v`` dropped; bytes as base64 under the field's name + ``_base64``).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.codec import Message, to_map
from sandpod_contract.errors import BadRequest, PayloadTooLarge, SandpodError
from sandpod_gateway import jsonbody
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import error_response
from sandpod_gateway.upstream import Target

__all__ = [
    "Body",
    "handler",
    "message_json",
    "query_bool",
    "query_float",
    "query_int",
    "read_json",
    "target",
]

T = TypeVar("T")
MAX_INT = 2**53  # what JSON numbers carry exactly (and far inside msgpack's int64)
Handler = Callable[[Request], Awaitable[Response]]


def handler(fn: Handler) -> Handler:
    """Turn typed errors (and unexpected ones) into the JSON error response."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except SandpodError as exc:
            return error_response(exc)
        except ValueError as exc:  # a contract message refused a value (__post_init__)
            return error_response(BadRequest(str(exc)))

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def target(request: Request) -> Target:
    """The tenant's sandbox named in the path (404 if the tenant cannot own that name)."""
    return context(request).upstream.sandbox(principal(request).scope, request.path_params["name"])


class Body:
    """A JSON object body with typed accessors."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def _get(self, name: str, types: type | tuple[type, ...], what: str, default: Any) -> Any:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise BadRequest(f"{name}: expected {what}", field=name)
        if not isinstance(value, types):
            raise BadRequest(f"{name}: expected {what}", field=name)
        return value

    def text(self, name: str, default: str | None = None) -> str | None:
        return self._get(name, str, "a string", default)  # type: ignore[no-any-return]

    def req_text(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise BadRequest(f"missing required field {name!r}", field=name)
        return value

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self._get(name, int, "an integer", default)
        if value is not None and not -MAX_INT <= value <= MAX_INT:
            raise BadRequest(f"{name}: out of range", field=name)
        return value  # type: ignore[no-any-return]

    def number(self, name: str, default: float | None = None) -> float | None:
        value = self._get(name, (int, float), "a number", default)
        if value is None:
            return None
        if not -1e15 <= value <= 1e15:  # also refuses nan
            raise BadRequest(f"{name}: out of range", field=name)
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        return self._get(name, bool, "a boolean", default)  # type: ignore[no-any-return]

    def texts(self, name: str) -> tuple[str, ...] | None:
        value = self._get(name, list, "an array of strings", None)
        if value is None:
            return None
        if not all(isinstance(v, str) for v in value):
            raise BadRequest(f"{name}: expected an array of strings", field=name)
        return tuple(value)

    def text_map(self, name: str) -> dict[str, str] | None:
        value = self._get(name, dict, "an object of strings", None)
        if value is None:
            return None
        if not all(isinstance(v, str) for v in value.values()):
            raise BadRequest(f"{name}: expected an object of strings", field=name)
        return dict(value)

    def obj(self, name: str) -> dict[str, Any] | None:
        return self._get(name, dict, "an object", None)  # type: ignore[no-any-return]

    def data_bytes(self, name: str) -> bytes | None:
        """``name`` as UTF-8 text, or ``name_base64`` as base64; at most one of them."""
        text, b64 = self.text(name), self.text(f"{name}_base64")
        if text is not None and b64 is not None:
            raise BadRequest(f"give {name} or {name}_base64, not both", field=name)
        if b64 is not None:
            try:
                return base64.b64decode(b64, validate=True)
            except ValueError as exc:
                raise BadRequest(f"{name}_base64: not base64", field=f"{name}_base64") from exc
        return None if text is None else text.encode()


async def read_json(request: Request, optional: bool = False) -> Body:
    """The request's JSON object. Raises BadRequest / PayloadTooLarge."""
    limit = context(request).settings.max_json_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"JSON body over {limit} bytes", limit=limit)
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise PayloadTooLarge(f"JSON body over {limit} bytes", limit=limit)
    if not raw and optional:
        return Body({})
    try:
        data = jsonbody.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return Body(data)


def query_int(request: Request, name: str, default: int | None = None, minimum: int = 0) -> Any:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected an integer", field=name) from None
    if not minimum <= value <= MAX_INT:
        raise BadRequest(f"{name}: must be in {minimum}..{MAX_INT}", field=name)
    return value


def query_float(request: Request, name: str, default: float | None = None) -> Any:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a number", field=name) from None
    if not 0 <= value < 1e9:
        raise BadRequest(f"{name}: out of range", field=name)
    return value


def query_bool(request: Request, name: str, default: bool = False) -> bool:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise BadRequest(f"{name}: expected true or false", field=name)


def message_json(msg: Message) -> dict[str, Any]:
    """A contract message as JSON: its wire map without ``v``; bytes fields base64-encoded."""
    return _jsonable(to_map(msg))  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k == "v":
                continue
            if isinstance(v, bytes):
                out[f"{k}_base64"] = base64.b64encode(v).decode()
            else:
                out[k] = _jsonable(v)
        return out
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def json_response(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)

"""Request bodies read strictly: what JSON allows but a careful API should not.

- a duplicate key is rejected (which value the client meant is unknowable);
- a key or string holding NUL or an unpaired surrogate is rejected (PostgreSQL's jsonb holds
  no NUL, and a lone surrogate would be silently replaced on the way to the log);
- the body model is validated in pydantic's strict mode: no "8" for 8, no "yes" for true.

Routers opt in with `APIRouter(route_class=StrictJsonRoute)`.
"""

from __future__ import annotations

import email.message
import json
import math
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from services.api.problems import ProblemError, field_errors, summarize


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Built by dict() in C; only an object with fewer keys than pairs is walked, for the first
    # key given twice (every object of every body comes through here).
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return found


def _storable(text: str) -> bool:
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False  # an unpaired surrogate
    return True


def _check_strings(value: Any, path: str = "body") -> None:
    if isinstance(value, str):
        if not _storable(value):
            raise ProblemError(
                422, "invalid-string", f"{path}: strings must not hold NUL or unpaired surrogates"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            if not _storable(key):
                raise ProblemError(
                    422, "invalid-string", f"{path}: keys must not hold NUL or unpaired surrogates"
                )
            _check_strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{path}[{index}]")


class _NotFinite(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise _NotFinite(name)


def _finite(text: str) -> float:
    # A literal too large for a double (1e999) is read as infinity without a word: the same
    # non-number as `Infinity`, recorded as null.
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


# Built once: json.loads with hooks builds a JSONDecoder per call (its scanner included).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite
)


def parse_strict_json(body: bytes) -> Any:
    """The body's JSON, rejecting duplicate keys, NaN and Infinity (which Python's reader
    takes and JSON does not: they would be recorded as null) and numbers that overflow to
    infinity, NUL and unpaired surrogates."""
    try:
        text = body.decode("utf-8")
        if text.startswith("\ufeff"):  # as json.loads refuses a str that starts with a BOM
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        data = _DECODER.decode(text)
    except _Duplicate as duplicate:
        raise ProblemError(400, "duplicate-key", f"the key {duplicate} appears twice") from None
    except _NotFinite as constant:
        raise ProblemError(
            400, "malformed-json", f"{constant} is not a JSON number (numbers must be finite)"
        ) from None
    except UnicodeDecodeError:
        raise ProblemError(400, "malformed-json", "the request body is not UTF-8") from None
    except RecursionError:
        # Python's reader recurses per level: a body of 5,000 nested arrays (10 kB) is no job.
        raise ProblemError(400, "malformed-json", "the JSON is nested too deeply") from None
    except json.JSONDecodeError:
        raise  # answered by the route as malformed JSON, with where it fails
    except ValueError:
        # The reader's int() refuses an integer literal of more than sys.get_int_max_str_digits()
        # digits (4,300) with a bare ValueError, which the route answered only as "There was
        # an error parsing the body"; no field takes such a number.
        raise ProblemError(
            400,
            "malformed-json",
            f"an integer has more than {sys.get_int_max_str_digits()} digits",
        ) from None
    # A NUL or a lone surrogate can only be written as a \u escape: the reader refuses a
    # raw control character and the UTF-8 decoder an encoded surrogate. A body without one
    # holds neither, and its strings are not walked (a batch's thousand specs).
    if "\\u" in text:
        _check_strings(data)
    return data


def is_json_media(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (its strict_content_type
    rule): application/json or application/*+json, whatever the parameters."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


class StrictJsonRequest(Request):
    strict_model: TypeAdapter[Any] | None = None

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            data = parse_strict_json(body)
            if self.strict_model is not None:
                try:
                    # JSON mode: strict about numbers and booleans, while a datetime may
                    # still arrive as the string JSON can only give.
                    self.strict_model.validate_json(body, strict=True)
                except ValidationError as error:
                    errors = field_errors(
                        [{**item, "loc": ("body", *item["loc"])} for item in error.errors()]
                    )
                    raise ProblemError(
                        422, "validation-error", summarize(errors), errors=errors
                    ) from None
            self._json = data
        return self._json


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        body = self.body_field
        annotation = None if body is None else body.field_info.annotation
        adapter = None if annotation is None else TypeAdapter(annotation)

        async def strict_handler(request: Request) -> Response:
            strict = StrictJsonRequest(request.scope, request.receive)
            strict.strict_model = adapter
            # FastAPI hands a body of another media type to the model as bytes: `curl -d`
            # without -H sends its JSON as a form, which was told only "body: Input should be
            # a valid dictionary or object to extract fields from".
            if (
                adapter is not None
                and not is_json_media(strict.headers.get("content-type"))
                and await strict.body()
            ):
                raise ProblemError(
                    415,
                    "unsupported-media-type",
                    "the request body must be JSON, sent with 'Content-Type: application/json'",
                )
            return await handler(strict)

        return strict_handler
